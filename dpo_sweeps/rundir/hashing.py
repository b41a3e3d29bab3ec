"""What defines a run: `config_hash` of the resolved config (the keys that change what it computes), and
the difference between two configs in a few words."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from dpo_sweeps.config.schema import Config
from dpo_sweeps.config.section import setting_fields
from dpo_sweeps.config.setting import setting_of

# Keys that do not change what a run computes: they are left out of config_hash, so a resumed or
# re-launched sweep recognises its finished runs.
NON_DEFINING_KEYS = (
    "wandb",  # tracking.wandb before issue 49 (config/tracking_schema.py RENAMED)
    "tracking.wandb",
    "train.progress_bar",
    "resources.master_port",
    "resources.collective_timeout_s",
    "resources.hang_timeout_s",
    "train.time_limit_min",
    "checkpoint",  # when and how many checkpoints are kept does not change the results (exact resume)
    "model.install_hint",
    "cluster",  # the hardware a cost is predicted on (dpo_sweeps/cost/), not what the run computes
)

# Keys added after runs were written, with the value that trains as those runs did: dropped at that
# value, so that the runs' sweep directories still resume. Each is a field made with `setting(...,
# older_runs_lack=True)` (config/setting.py), at its default.
ADDED_KEYS = {key: f.default for key, _, f in setting_fields(Config)
              if (spec := setting_of(f)) is not None and spec.older_runs_lack}


def _drop_key(tree: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.get(part)
        if not isinstance(tree, dict):
            return
    tree.pop(leaf, None)


def config_hash(config: dict) -> str:
    """A stable hash of the resolved config keys that define the run.

    The loss-scale settings count only where loss scaling is on: the typed schema gives every precision
    preset them (before it, only fp16 had them), and runs written before it must keep their hash, so that
    their sweep directories still resume."""
    defining = json.loads(json.dumps(config))
    for key in NON_DEFINING_KEYS:
        _drop_key(defining, key)
    for key, former in ADDED_KEYS.items():
        *parents, name = key.split(".")
        section = defining
        for part in parents:
            section = section.get(part) if isinstance(section, dict) else None
        if isinstance(section, dict) and section.get(name, former) == former:
            _drop_key(defining, key)
    precision = defining.get("precision")
    if isinstance(precision, dict) and not precision.get("loss_scaling"):
        for key in ("initial_loss_scale", "loss_scale_growth_interval"):
            precision.pop(key, None)
    blob = json.dumps(defining, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_difference(saved: dict, current: dict, limit: int = 4) -> str:
    """The keys that differ between two configs, `key: old -> new`, the first `limit` of them."""
    before, after = _flat(saved), _flat(current)
    keys = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    shown = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
