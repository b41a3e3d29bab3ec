"""The Hydra task function (stage 2 of the road, docs/architecture.md), importable without the training stack.

`python -m dpo_sweeps --help`, `--cfg job`, a sweep's parent process and the process that starts a
run's local ranks never train, so they should not pay for importing torch and transformers: this module
imports `dpo_sweeps.app` only when a job runs, and a process that trains imports the training stack once
its config has passed the checks (`dpo_sweeps.app.train`). submitit pickles `run` by reference, so it
lives in a module, not in __main__, which wraps it with `hydra.main`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from dpo_sweeps.errors import FailureOnTheErrorLine
from dpo_sweeps.run_end import RunRefused, ended, finish, finish_in_sweep, refused
from dpo_sweeps.rundir.paths import remove_empty_run_dir


def run(cfg: DictConfig) -> dict[str, Any]:
    """Train one config (`dpo_sweeps.app.train`) as the job Hydra started; returns the summary.json metrics.
    How it ends (its last line, its exit status, or in a sweep the RunFailed it raises) is run_end.py's:
    where its results are and its headline metrics, or the one `error:` line."""
    try:
        hydra_cfg = HydraConfig.get()
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        run_dir = Path(hydra_cfg.runtime.output_dir)
        if not multirun:  # the error line says a failure: the ranks' own record of it goes to the log file
            for handler in logging.getLogger().handlers:
                if not isinstance(handler, logging.FileHandler):
                    handler.addFilter(FailureOnTheErrorLine())
        from dpo_sweeps.app import train

        summary = None
        try:
            summary = train(cfg, hydra_cfg)
            ending = ended(summary, run_dir)
        except RunRefused as exc:
            if exc.nothing_written and not multirun and not exc.quiet:
                remove_empty_run_dir(run_dir)
            ending = refused(exc)
        if multirun:
            finish_in_sweep(ending)
        else:
            finish(ending)
        return summary.metrics
    except KeyboardInterrupt:  # before the run took its directory (after, it stops with a summary)
        drop_empty_run_dir()
        raise


def drop_empty_run_dir() -> None:
    """A Ctrl-C after Hydra made a single run's directory and before the run took it (while the job
    checks its config or imports the training stack): the empty folder goes, as a refused run's does
    (`run` above). The log file opens there at its first line, which torch may write at exit: one not yet
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
