"""MLflow, through MLflow's own client (`MlflowClient`): a sweep is one parent run in the experiment, each
job a nested run under it (the `mlflow.parentRunId` tag MLflow's UI nests by), tagged `dpo_sweeps.sweep`,
`dpo_sweeps.stage`, `dpo_sweeps.trial` and `dpo_sweeps.plan`.

The parent is found by its sweep directory's tag, or made by the first job under a lock in the sweep
directory, so concurrent jobs and a later upload share one. A find_best sweep is one parent too: its sweep
directory is the root (RunInfo.sweep_dir), whose probe and train stages' jobs are tagged `probe` and `train`. A job's run is found again by its state
(tracking.json) or by its name under the parent: a resumed run and a second upload continue it.

Credentials come from MLflow's environment variables (MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD,
MLFLOW_TRACKING_TOKEN), read by the client per request and stored nowhere; the URI holds none (schema).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from dpo_sweeps.config.schema import Config
from dpo_sweeps.rundir.atomic import write_json_atomic
from dpo_sweeps.tracking.backend import RunEnd
from dpo_sweeps.tracking.run_info import RunInfo

TAG = "dpo_sweeps."
SWEEP_UID_TAG = TAG + "sweep_uid"
RUN_UID_TAG = TAG + "run_uid"
SWEEP_STATE = "sweep_tracking.json"  # in the sweep directory: the sweep's identity in the trackers
STATUS = {"completed": "FINISHED", "failed": "FAILED", "pruned": "KILLED", "skipped": "KILLED"}
# A server that does not answer costs seconds, not MLflow's default minutes of retries (users may set these).
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
PARAMS_PER_CALL = 100  # MLflow's log_batch limit


def build(cfg: Config, run_dir: Path) -> MlflowBackend:
    return MlflowBackend(cfg.tracking.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", ""),
                         cfg.tracking.mlflow.experiment_name)


class MlflowBackend:
    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment_name: str):
        for key, value in CLIENT_ENV.items():
            os.environ.setdefault(key, value)
        from mlflow.tracking import MlflowClient

        if not tracking_uri:
            raise ValueError("no tracking URI: set tracking.mlflow.tracking_uri or MLFLOW_TRACKING_URI")
        self.where = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment_name = experiment_name
        self.run_id: str | None = None

    def _experiment_id(self) -> str:
        experiment = self.client.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            return experiment.experiment_id
        from mlflow.exceptions import MlflowException

        try:
            return self.client.create_experiment(self.experiment_name)
        except MlflowException:  # another job made it first
            return self.client.get_experiment_by_name(self.experiment_name).experiment_id

    def _find(self, experiment_id: str, **tags: str) -> str | None:
        query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
        runs = self.client.search_runs([experiment_id], filter_string=query, max_results=1,
                                       order_by=["attributes.start_time ASC"])
        return runs[0].info.run_id if runs else None

    def sweep_parent(self, experiment_id: str, run: RunInfo) -> str:
        """The sweep's parent run: found by the sweep's identity (made by its first job), else made, under a
        lock in the sweep directory held by one job at a time."""
        sweep_dir = Path(run.sweep_dir)
        with open(sweep_dir / ".tracking.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                uid = json.loads((sweep_dir / SWEEP_STATE).read_text())["sweep_uid"]
            except (OSError, ValueError, KeyError):
                uid = uuid.uuid4().hex
                write_json_atomic(sweep_dir / SWEEP_STATE, {"sweep_uid": uid})
            parent = self._find(experiment_id, **{SWEEP_UID_TAG: uid})
            if parent is None:
                parent = self.client.create_run(experiment_id, run_name=run.sweep, tags={
                    SWEEP_UID_TAG: uid, TAG + "sweep": run.sweep, TAG + "sweep_dir": str(sweep_dir.resolve()),
                }).info.run_id
            return parent

    def start(self, run: RunInfo, state: dict[str, Any] | None) -> dict[str, Any]:
        from mlflow.entities import Param

        experiment_id = self._experiment_id()
        parent = self.sweep_parent(experiment_id, run) if run.sweep_dir is not None else None
        if state and state.get("tracking_uri") == self.where and state.get("run_id"):
            self.run_id = self.client.get_run(state["run_id"]).info.run_id  # it must still be there
        else:
            self.run_id = self._find(experiment_id, **{RUN_UID_TAG: run.uid})
        tags = {RUN_UID_TAG: run.uid, **{TAG + k: v for k, v in run.tags.items()}}
        if parent is not None:
            tags["mlflow.parentRunId"] = parent
        if self.run_id is None:
            self.run_id = self.client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
            params = [Param(key, str(value)) for key, value in sorted(run.params.items())]
            for first in range(0, len(params), PARAMS_PER_CALL):
                self.client.log_batch(self.run_id, params=params[first:first + PARAMS_PER_CALL])
        else:  # continued: running again until it ends
            self.client.update_run(self.run_id, status="RUNNING")
            for key, value in tags.items():
                self.client.set_tag(self.run_id, key, value)
        return {"tracking_uri": self.where, "experiment_id": experiment_id, "run_id": self.run_id,
                "parent_run_id": parent}

    def logged_steps(self) -> dict[str, int]:
        keys = self.client.get_run(self.run_id).data.metrics
        return {key: max(m.step for m in self.client.get_metric_history(self.run_id, key)) for key in keys}

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def finish(self, end: RunEnd) -> None:
        self.client.set_tag(self.run_id, TAG + "status", end.status)
        if end.failure_kind:
            self.client.set_tag(self.run_id, TAG + "failure_kind", end.failure_kind)
        if end.summary_path is not None:
            self.client.log_artifact(self.run_id, str(end.summary_path))
        self.client.set_terminated(self.run_id, STATUS.get(end.status, "FAILED"))


def log_report(sweep_dir: Path, files: list[Path]) -> str | None:
    """The report's files (report.html, ranking.csv) to the sweep's parent run, when its jobs logged to MLflow
    (a job's tracking.json names the server and the parent); the parent is marked finished once every job
    has ended (has its summary.json). A find_best's jobs are a level down, in its stages' folders (probes/,
    train/), and share the root's parent run. Returns the parent's run id, or None."""
    from dpo_sweeps.tracking.tracker import STATE_FILE, read_state

    sweep_dir = Path(sweep_dir)
    jobs = sorted(path.parent for pattern in (f"*/{STATE_FILE}", f"*/*/{STATE_FILE}") for path in sweep_dir.glob(pattern))
    for job in jobs:
        state = read_state(job).get("mlflow") or {}
        if state.get("parent_run_id"):
            backend = MlflowBackend(state["tracking_uri"], "unused")
            for path in files:
                backend.client.log_artifact(state["parent_run_id"], str(path), artifact_path="report")
            if all((j / "summary.json").exists() for j in jobs):
                backend.client.set_terminated(state["parent_run_id"], "FINISHED")
            return state["parent_run_id"]
    return None
