"""The Hydra task function, importable without the training stack.

`python -m dpo_sweeps --help`, `--cfg job` and a sweep's parent process never train, so they should
not pay for importing torch and transformers; the job that trains imports them (dpo_sweeps.app) when
it starts. submitit pickles this function by reference, so it lives in a module, not in __main__.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train one config (dpo_sweeps.app.run): returns the summary.json metrics; failed runs raise or exit 1."""
    from dpo_sweeps.app import run as run_config

    return run_config(cfg)


@dataclass
class RunContext:
    """What every rank needs to know about the run, beyond the config."""

    run_dir: Path
    config: dict  # the resolved config, plain containers
    overrides: list[str]
    base_dir: Path  # where relative data paths resolve (the user's working directory)
    run_name: str = "run"
    group: str = "run"
    attempt: str = ""
    started_at: float = 0.0  # time.time() when this attempt's Hydra task began (summary.json's cost fields)
    # The run's .hydra/ files (rundir/hydra_record.py), written by the job that takes the run directory's lock.
    hydra_record: dict[str, str] = field(default_factory=dict)
