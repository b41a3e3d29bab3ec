"""The Hydra task function, importable without the training stack.

`python -m dpo_sweeps --help`, `--cfg job` and a sweep's parent process never train, so they should
not pay for importing torch and transformers; the job that trains imports them (dpo_sweeps.app) when
it starts. submitit pickles this function by reference, so it lives in a module, not in __main__.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train one config (dpo_sweeps.app.run): returns the summary.json metrics; failed runs raise or exit 1."""
    from dpo_sweeps.app import run as run_config

    return run_config(cfg)
