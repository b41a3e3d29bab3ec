"""DPO_SWEEPS_SMOKE=1: every run a command starts trains 2 steps and evaluates at most 8 held-out pairs.

For trying a documented command in seconds, and for the test that runs the docs' commands as written
(tests/integration/test_docs_run.py). It acts where a resolved config becomes the typed Config
(`Config.of`), so a run, a sweep's checks before launch and its cost forecast all see the cut values.
summary.json's `config` keeps the values as composed: a rerun of the same sweep without the variable
would skip its runs as completed, so give a smoke run its own `hydra.sweep.dir` or `hydra.run.dir`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dpo_sweeps.config.section import refuse

SMOKE_ENV = "DPO_SWEEPS_SMOKE"
SMOKE_STEPS = 2
SMOKE_EVAL_PAIRS = 8


def smoke_on() -> bool:
    value = os.environ.get(SMOKE_ENV, "")
    if value not in ("", "0", "1"):
        refuse(SMOKE_ENV, f"got {value!r}", "1 (cut every run to 2 steps), 0 or unset")
    return value == "1"


def smoke_cut(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """The resolved config's values with `train.max_steps` and `train.eval_max_pairs` cut to the smoke's,
    when DPO_SWEEPS_SMOKE=1 (a value already smaller stays); otherwise the values as they are."""
    train = values.get("train")
    if not smoke_on() or not isinstance(train, Mapping):
        return values
    cut = dict(train)
    for key, smoke in (("max_steps", SMOKE_STEPS), ("eval_max_pairs", SMOKE_EVAL_PAIRS)):
        value = train.get(key)
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > smoke):
            cut[key] = smoke  # a value of another type stays, for the section's check to refuse
    return {**values, "train": cut}
