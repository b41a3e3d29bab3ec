"""The Hydra task function, importable without the training stack.

`python -m dpo_sweeps --help`, `--cfg job`, a sweep's parent process and the process that starts a
run's local ranks never train, so they should not pay for importing torch and transformers; a process
that trains imports them once its config has passed the checks (dpo_sweeps.app.run_config). submitit
pickles this function by reference, so it lives in a module, not in __main__.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from dpo_sweeps.rundir.paths import remove_empty_run_dir


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train one config (dpo_sweeps.app.run): returns the summary.json metrics; failed runs raise or exit 1."""
    try:
        from dpo_sweeps.app import run as run_config

        return run_config(cfg)
    except KeyboardInterrupt:  # before the run took its directory (after, it stops with a summary)
        drop_empty_run_dir()
        raise


def drop_empty_run_dir() -> None:
    """A Ctrl-C after Hydra made a single run's directory and before the run took it (while the job
    checks its config or imports the training stack): the empty folder goes, as a refused run's does
    (app.py). The log file opens there at its first line, which torch may write at exit: one not yet
    opened goes with it."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        return
    run_dir = Path(os.path.abspath(str(hydra_cfg.runtime.output_dir)))
    try:
        if any(run_dir.iterdir()):
            return
    except OSError:
        return
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == run_dir:
            root.removeHandler(handler)
            handler.close()
    remove_empty_run_dir(run_dir)
