"""What a sweep set out to run, read from the `multirun.yaml` Hydra writes in its directory.

A sweep still going has run directories only for the jobs that have started, so the jobs
planned but not yet started are counted from the sweep's own definition: the product of
its swept values (grid sweeps, parsed with Hydra's override grammar) or its `n_trials`
(Optuna sweeps).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml


def _hydra_section(sweep_dir: Path) -> dict[str, Any]:
    try:
        multirun = yaml.safe_load((sweep_dir / "multirun.yaml").read_text(encoding="utf-8"))
        return dict(multirun["hydra"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return {}


def sweeper_config(sweep_dir: Path) -> dict[str, Any]:
    """`hydra.sweeper` from the sweep's multirun.yaml ({} when absent or unreadable)."""
    return dict(_hydra_section(sweep_dir).get("sweeper") or {})


def planned_jobs(sweep_dir: Path) -> int | None:
    """How many jobs the sweep launches in all; None when that cannot be told."""
    hydra = _hydra_section(sweep_dir)
    sweeper = hydra.get("sweeper") or {}
    if not sweeper:
        return None
    if "n_trials" in sweeper:  # a search sweeper (Optuna)
        return sweeper["n_trials"] if isinstance(sweeper["n_trials"], int) else None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    # As Hydra's BasicSweeper: swept values from the config, then the command line; per key the
    # last one wins, and the jobs are every combination.
    params = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
    try:
        task = [str(o) for o in (hydra.get("overrides") or {}).get("task") or []]
        overrides = OverridesParser.create().parse_overrides(params + task)
        counts: dict[str, int] = {}
        for override in overrides:
            if override.is_sweep_override() and not override.is_discrete_sweep():
                return None  # an interval: only a search sweeper can run it
            discrete = override.is_sweep_override()
            counts[override.get_key_element()] = len(list(override.sweep_string_iterator())) if discrete else 1
    except Exception:  # glob() needs the config; anything else Hydra cannot parse alone
        return None
    return math.prod(counts.values())


def not_started(sweep_dirs: list[Path], run_dirs_by_sweep: dict[Path, int]) -> int | None:
    """Jobs planned by the sweeps that have no run directory yet; None when no sweep says."""
    counts = [(planned_jobs(s), run_dirs_by_sweep.get(s, 0)) for s in sweep_dirs]
    known = [max(0, planned - present) for planned, present in counts if planned is not None]
    return sum(known) if known else None
