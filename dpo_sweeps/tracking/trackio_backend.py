"""Trackio, Hugging Face's local-first tracker (its own `trackio.init` / `Run.log` / `Run.finish`): the
sweep is the project (tracking.trackio.project overrides it), each job a run named after it, grouped by
stage. Its local database is under TRACKIO_DIR (`trackio show` opens the dashboard on it).

A resumed run continues its run (`resume="allow"`: the latest of that name) past the last step Trackio
holds; a run started afresh is a new Trackio run even where an earlier one had its name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpo_sweeps.config.schema import Config
from dpo_sweeps.tracking.backend import RunEnd
from dpo_sweeps.tracking.run_info import RunInfo


def build(cfg: Config, run_dir: Path) -> TrackioBackend:
    return TrackioBackend(cfg.tracking.trackio.project)


class TrackioBackend:
    name = "trackio"

    def __init__(self, project: str | None):
        import trackio

        self._trackio = trackio
        self.project = project
        self.where = str(trackio.TRACKIO_DIR)
        self.run = None

    def start(self, run: RunInfo, state: dict[str, Any] | None) -> dict[str, Any]:
        # The project name is a folder and a database name: the sweep's DATE/TIME becomes DATE_TIME.
        self.project = (state or {}).get("project") or self.project or run.sweep.replace("/", "_")
        self.run = self._trackio.init(project=self.project, name=run.name, group=run.stage,
                                      config={**run.params, **{f"dpo_sweeps.{k}": v for k, v in run.tags.items()}},
                                      resume="allow" if state else "never", embed=False, auto_log_cpu=False,
                                      auto_log_gpu=False)
        self.where = f"{self.where} (project {self.project})"
        return {"project": self.project, "run": run.name}

    def logged_steps(self) -> dict[str, int]:
        # Per metric, not the run's last step: a step's train and eval records are two log calls, and a
        # kill between Trackio's writes of the two leaves the eval one to be sent again.
        held: dict[str, int] = {}
        for row in self._trackio.SQLiteStorage.get_logs(self.project, run_id=self.run.id, scalar_only=True):
            step = int(row["step"])
            for key in row.keys() - {"step", "timestamp"}:
                held[key] = max(held.get(key, step), step)
        return held

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, end: RunEnd) -> None:
        # Trackio runs have no status: the end is an alert (shown on the run's page), not a metric, so it
        # takes no step from a resumed run.
        from trackio.alerts import AlertLevel

        text = f"status {end.status}" + (f", failure kind {end.failure_kind}" if end.failure_kind else "")
        self.run.alert(f"run {end.status}", text=text,
                       level=AlertLevel.INFO if end.status == "completed" else AlertLevel.ERROR)
        self.run.finish()
