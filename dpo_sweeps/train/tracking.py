"""wandb logging from rank 0: the resolved config (secrets scrubbed) and every logged metric.

`wandb.mode` is offline by default, so nothing needs a network; runs are then synced with
`wandb sync <run_dir>/wandb/offline-run-*`. The wandb group is the whole sweep (`sweep_group`), and
the job type says what a run is in it (`job_type_of`: probe, trial or train), so find_best's stages
and an Optuna study's trials read apart.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from dpo_sweeps.config.schema import Config
from dpo_sweeps.rundir.secrets import scrub_secrets
from dpo_sweeps.train.pruning import TRIAL_FILE  # the Optuna sweeper writes it into every trial's run

log = logging.getLogger(__name__)
# Hydra's default sweep directory, multirun/DATE/TIME: the time alone does not name the sweep.
_DATE, _TIME = re.compile(r"\d{4}-\d{2}-\d{2}"), re.compile(r"\d{2}-\d{2}-\d{2}")


def sweep_group(sweep_dir: Path) -> str:
    """The wandb group of a sweep's runs: `DATE/TIME` for Hydra's default multirun/DATE/TIME, else the
    sweep directory's name (`multirun/optuna_dpo` -> `optuna_dpo`)."""
    sweep_dir = Path(sweep_dir)
    if _TIME.fullmatch(sweep_dir.name) and _DATE.fullmatch(sweep_dir.parent.name):
        return f"{sweep_dir.parent.name}/{sweep_dir.name}"
    return sweep_dir.name


def job_type_of(cfg: Config, run_dir: Path) -> str:
    """What the run is: a `probe` (probe.steps > 0), an Optuna `trial`, or a `train` run."""
    if cfg.probe.steps > 0:
        return "probe"
    return "trial" if (Path(run_dir) / TRIAL_FILE).exists() else "train"


class Tracker:
    """A wandb run, or nothing when disabled or not rank 0."""

    def __init__(self, cfg: Config, *, run_dir: Path, name: str, group: str, config: dict, enabled: bool):
        """`cfg`: the run's typed config; `config`: the same as plain containers, logged (secrets scrubbed)."""
        self._run = None
        wandb_cfg = cfg.wandb
        if not enabled or wandb_cfg.mode == "disabled":
            return
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._run = wandb.init(
            mode=wandb_cfg.mode,
            project=wandb_cfg.project,
            entity=wandb_cfg.entity,
            group=wandb_cfg.group or group,
            job_type=job_type_of(cfg, run_dir),
            name=name,
            dir=str(run_dir),
            config=scrub_secrets(config),
            reinit="finish_previous",
            # No system metadata: it would record the command line, which may carry secrets.
            settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True, save_code=False),
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self._run is not None:
            self._run.log({k: v for k, v in metrics.items() if v is not None and k != "step"}, step=step)

    def finish(self, summary_metrics: dict[str, Any], failed: bool) -> None:
        if self._run is None:
            return
        try:
            for key, value in summary_metrics.items():
                if value is not None:
                    self._run.summary[key] = value
            self._run.finish(exit_code=1 if failed else 0)
        except OSError as exc:  # a full disk: the W&B copy is incomplete; summary.json says how the run ended
            log.warning("wandb: its record under %s could not be finished: %s", self._run.dir, exc)
        self._run = None
