"""W&B (`wandb.init`), offline by default (`tracking.wandb.mode`), so nothing needs a network; an offline run is
synced with `wandb sync <run_dir>/wandb/offline-run-*`. The W&B group is the sweep (or `tracking.wandb.group`),
the job type the stage. A resumed run continues the same W&B id (`resume="allow"`). Online, W&B tells it
its next step (`logged_steps`), so only later steps are sent; offline it cannot, so the resumed attempt
replays all of metrics.jsonl into its own offline record, which alone then holds every step (docs/trackers.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dpo_sweeps.config.schema import Config
from dpo_sweeps.config.tracking_schema import WandbConfig
from dpo_sweeps.tracking.backend import RunEnd
from dpo_sweeps.tracking.run_info import RunInfo


def build(cfg: Config, run_dir: Path) -> WandbBackend:
    return WandbBackend(cfg.tracking.wandb, Path(run_dir))


class WandbBackend:
    name = "wandb"

    def __init__(self, cfg: WandbConfig, run_dir: Path):
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._wandb = wandb
        self.cfg, self.run_dir = cfg, run_dir
        self.where = f"{cfg.mode} {run_dir / 'wandb'}" if cfg.mode == "offline" else f"{cfg.mode} project {cfg.project}"
        self.run = None

    def start(self, run: RunInfo, state: dict[str, Any] | None) -> dict[str, Any]:
        wandb = self._wandb
        run_id = (state or {}).get("id") or run.uid  # the run's own identity (tracking.json)
        self.run = wandb.init(
            mode=self.cfg.mode, project=self.cfg.project, entity=self.cfg.entity, group=self.cfg.group or run.sweep,
            job_type=run.stage, name=run.name, dir=str(self.run_dir), config=run.config, id=run_id, resume="allow",
            tags=[f"{k}:{v}" for k, v in run.tags.items() if k != "sweep"][:64],
            reinit="finish_previous",
            # No system metadata: it would record the command line, which may carry secrets.
            settings=wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True, save_code=False),
        )
        return {"id": run_id}

    def logged_steps(self) -> dict[str, int]:
        step = self.run.step  # the next step W&B takes: a resumed online run's
        return {"*": step - 1} if step > 0 else {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, end: RunEnd) -> None:
        self.run.summary["status"] = end.status
        if end.failure_kind:
            self.run.summary["failure_kind"] = end.failure_kind
        if end.summary_path is not None and self.cfg.mode == "online":
            self.run.save(str(end.summary_path), base_path=str(end.summary_path.parent), policy="now")
        self.run.finish(exit_code=0 if end.status == "completed" else 1)
