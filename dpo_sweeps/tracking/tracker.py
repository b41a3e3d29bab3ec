"""Rank 0's trackers: every chosen backend gets the same run through one code path (`Tracker`).

What each gets: the resolved config (flattened, secrets scrubbed), every metrics.jsonl metric at its
step, the sweep, stage, trial and plan, and at the end the status, failure kind and summary.json.

Resume: `tracking.json` in the run directory keeps what each backend needs to continue its run (MLflow's
run id, W&B's id, the event directory). A resumed run continues it and first replays metrics.jsonl
(`replay`) past what the backend already holds (`logged_steps`), so a step lost to a kill is filled and
none is written twice. `dpo-sweeps-report --to` uploads a finished run through the same replay.

A backend that fails (a server down at the start or mid-run, refused credentials) is one warning naming
it and where it writes; it is dropped for the rest of the run, training goes on, metrics.jsonl stays
complete, and summary.json's `tracking` says from which step it missed data.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import uuid
from pathlib import Path
from typing import Any

from dpo_sweeps.config.schema import Config
from dpo_sweeps.rundir.atomic import write_json_atomic
from dpo_sweeps.rundir.metrics_log import read_records
from dpo_sweeps.rundir.summary import SUMMARY, Summary, rewrite_summary
from dpo_sweeps.tracking.backend import Backend, RunEnd, build_backend
from dpo_sweeps.tracking.run_info import RunInfo

log = logging.getLogger(__name__)

STATE_FILE = "tracking.json"
UPLOADS = ("mlflow", "tensorboard")  # the trackers `dpo-sweeps-report --to` uploads to (upload.py)


def read_state(run_dir: Path) -> dict[str, Any]:
    """tracking.json: what each backend needs to continue its run, and the run's uid ({} when none)."""
    try:
        state = json.loads((Path(run_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


class _Live:
    """One backend of a run, with how far it holds each metric."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.logged: dict[str, int] = {}
        self.missed: str | None = None  # why and from which step it stopped receiving data
        self.state: dict[str, Any] = {}


class Tracker:
    """The chosen backends of one run, or nothing when not rank 0 or none is chosen."""

    def __init__(self, cfg: Config, *, run_dir: Path, name: str, group: str, sweep_dir: Path | None, config: dict,
                 enabled: bool, plan_label: str | None = None, backends: list[Backend] | None = None):
        """`sweep_dir`: the sweep the run is a job of (None: a single run); `config`: the resolved config as
        plain containers (logged with secrets scrubbed); `backends`: built already, instead of
        cfg.tracking.backends (an upload's, analysis/upload.py)."""
        self.run_dir = Path(run_dir)
        self._live: list[_Live] = []
        self._replay_pending = True
        self.sent = 0  # metric points sent to the backends (an upload reports it)
        self._gone: list[_Live] = []  # backends dropped after a failure
        self._failed_start: dict[str, str] = {}  # backend -> where, for those that could not start
        if not enabled:
            return
        names = [n for n in cfg.tracking.backends if n != "wandb" or cfg.tracking.wandb.mode != "disabled"]
        if backends is not None:
            names = [b.name for b in backends]
        if not names:
            return  # files only: no tracking.json, no summary.json `tracking`
        saved = read_state(self.run_dir)
        saved.setdefault("run_uid", uuid.uuid4().hex)
        run = dataclasses.replace(RunInfo.of(cfg, run_dir=run_dir, name=name, group=group, sweep_dir=sweep_dir,
                                             config=config, plan_label=plan_label), uid=saved["run_uid"])
        for backend_name in names:
            live = None
            try:
                built = [b for b in backends or [] if b.name == backend_name]
                live = _Live(built[0] if built else build_backend(backend_name, cfg, self.run_dir))
                live.state = live.backend.start(run, saved.get(backend_name))
                live.logged = live.backend.logged_steps()
            except Exception as exc:  # noqa: BLE001 (any failure of a tracker: never the run's)
                where = live.backend.where if live is not None else backend_name
                self._warn(backend_name, where, "at the start", exc)
                self._failed_start[backend_name] = where
                continue
            self._live.append(live)
        self._save_state(saved)

    def _save_state(self, saved: dict[str, Any]) -> None:
        try:
            write_json_atomic(self.run_dir / STATE_FILE, {**saved, **{lv.backend.name: lv.state for lv in self._live}})
        except OSError as exc:
            log.warning("tracking: %s could not be written (%s); a resumed run starts new tracker runs",
                        self.run_dir / STATE_FILE, exc)

    @staticmethod
    def _warn(name: str, where: str, when: str, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        later = f" (dpo-sweeps-report SWEEP_DIR --to {name} ... uploads them later)" if name in UPLOADS else ""
        log.warning("tracking: %s at %s failed %s (%s); training goes on without it, metrics.jsonl keeps every "
                    "metric%s", name, where, when, reason, later)

    def _send(self, live: _Live, record: dict[str, Any]) -> None:
        step = int(record["step"])
        floor = live.logged.get("*", -1)
        metrics = {}
        for key, value in record.items():
            number = _numeric(value)
            if key != "step" and number is not None and step > live.logged.get(key, floor):
                metrics[key] = number
        if not metrics:
            return
        try:
            live.backend.log(metrics, step)
        except Exception as exc:  # noqa: BLE001
            self._drop(live, f"from step {step}", exc)
            return
        for key in metrics:
            live.logged[key] = step
        self.sent += len(metrics)

    def _drop(self, live: _Live, when: str, exc: BaseException) -> None:
        self._warn(live.backend.name, live.backend.where, when, exc)
        live.missed = f"{when}: {type(exc).__name__}"
        self._live.remove(live)
        self._gone.append(live)

    def log(self, record: dict[str, Any], step: int) -> None:
        """One metrics.jsonl record (already appended there). The first call of a run replays metrics.jsonl,
        so a resumed run fills what its trackers lack before going on."""
        records = [{**record, "step": step}]
        if self._replay_pending:
            self._replay_pending = False
            records = read_records(self.run_dir) or records
        for live in list(self._live):
            for rec in records:
                if live in self._live:
                    self._send(live, rec)

    def replay(self) -> None:
        """Send metrics.jsonl's records the backends do not hold yet (an upload after the run)."""
        self._replay_pending = False
        for live in list(self._live):
            for rec in read_records(self.run_dir):
                if live in self._live:
                    self._send(live, rec)

    def finish(self, summary: Summary) -> Summary:
        """The end of the run (summary.json written): summary metrics, status, failure kind and summary.json
        to every backend; then summary.json's `tracking` says where each went and which missed data."""
        tracking = self.end(summary)
        if not tracking:
            return summary
        try:
            return rewrite_summary(self.run_dir, summary, tracking=tracking)
        except OSError as exc:  # a full disk: summary.json stays as written, without `tracking`
            log.warning("tracking: summary.json could not record where the run was reported: %s", exc)
            return summary

    def end(self, summary: Summary) -> dict[str, Any] | None:
        """`finish` without rewriting summary.json: returns its `tracking` record (None: no backend chosen)."""
        if self._replay_pending:
            self.replay()
        step = int(summary.metrics.get("steps") or max((lv.logged.get(k, 0) for lv in self._live for k in lv.logged),
                                                       default=0))
        final = {"step": step, **{k: v for k, v in summary.metrics.items() if k != "steps"}}
        end = RunEnd(status=str(summary.status), failure_kind=summary.failure.kind if summary.failure else None,
                     summary_path=self.run_dir / SUMMARY if (self.run_dir / SUMMARY).exists() else None)
        for live in list(self._live):
            known = {k for k in live.logged if k != "*"}
            # The summary's metrics the records did not have (perf/tokens_per_s, ...), at the last step.
            self._send(live, {k: v for k, v in final.items() if k == "step" or k not in known})
            if live not in self._live:
                continue
            try:
                live.backend.finish(end)
            except Exception as exc:  # noqa: BLE001
                self._drop(live, "at the end", exc)
        record = {lv.backend.name: {"where": lv.backend.where, "missed": None} for lv in self._live}
        record.update({lv.backend.name: {"where": lv.backend.where, "missed": lv.missed}
                       for lv in self._gone})
        record.update({name: {"where": where, "missed": "from the start"} for name, where in self._failed_start.items()})
        self._live = []
        return record or None

    @property
    def backends(self) -> list[str]:
        return [lv.backend.name for lv in self._live]
