"""summary.json (INTERFACE.md) as one typed record, `Summary`: what rank 0 writes when a run ends,
completed or failed, what a launcher or sweeper writes for a run that never wrote one, and what the
launchers, the sweepers and the report read back. Written atomically; space is held for it from the
start, so a full disk still gets it.

Which attempt wrote a summary is its `attempt`: whoever starts an attempt knows its id (the Hydra task
for a run of its own, the launcher for a sweep's job: runtime/context.py ATTEMPT_ENV), and
`read_summary(run_dir, attempt=...)` is the one test of whether an attempt has written its summary yet.
"""

from __future__ import annotations

import dataclasses
import errno
import json
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from dpo_sweeps.errors import Failure
from dpo_sweeps.redaction import scrub_overrides, scrub_secrets
from dpo_sweeps.rundir.atomic import finite_or_none, write_json_atomic
from dpo_sweeps.rundir.hashing import config_hash

SCHEMA = 1

SUMMARY = "summary.json"

# Space held for summary.json from the start of a run, so a full disk still gets its summary.
SUMMARY_RESERVE = ".summary_reserve"
SUMMARY_RESERVE_BYTES = 256 * 1024

PERF_METRIC_KEYS = (
    "perf/tokens_per_s",
    "perf/tokens_per_s_per_device",
    "perf/examples_per_s",
    "perf/peak_memory_gib",
    "perf/speed_per_memory",
    "perf/step_time_s",
    "perf/mfu",
)
SUMMARY_METRIC_KEYS = (
    "eval/rewards/accuracies",
    "eval/rewards/margins",
    "eval/loss",
    "train/loss",
    *PERF_METRIC_KEYS,
    "steps",
    "world_size",
)


class Status(StrEnum):
    """summary.json's `status`."""

    COMPLETED = "completed"
    FAILED = "failed"
    PRUNED = "pruned"  # an Optuna trial the pruner stopped at an evaluation
    SKIPPED = "skipped"  # a sweep point the fit check did not start (failure kind oom_predicted)


class SummaryUnreadable(ValueError):
    """A summary.json that breaks INTERFACE.md's contract; the message says how, in one line."""


@dataclass(frozen=True)
class Summary:
    """summary.json: the run record every writer makes and every reader reads (INTERFACE.md names the keys).

    The optional keys are written when set, so each writer's file has the keys it always had: a rank's
    has attempt, cost and the plan, a launcher's `written_by`, a point the fit check skipped no attempt.
    `rank` and `written` are not written: they say what a rank's run came to in memory."""

    status: Status
    failure: Failure | None
    overrides: list[str]
    config: dict[str, Any]
    """The resolved config, plain containers (secrets scrubbed when written)."""
    metrics: dict[str, Any]
    config_hash: str | None = None
    """None: the hash of `config`, computed when written (rundir/hashing.py)."""
    schema: int = SCHEMA
    attempt: str | None = None
    """The id of the attempt that wrote it (runtime/context.py)."""
    written_by: str | None = None
    """Who wrote it when no rank did: a launcher, a sweeper (the fit check, a refused trial)."""
    started_at: str | None = None
    ended_at: str | None = None
    wall_s: float | None = None
    device_seconds: float | None = None
    device_kind: str | None = None
    resumed_from_step: int | None = None
    """Written, null too, by a rank that built its trainer (beside `plan`)."""
    data: dict[str, Any] | None = None
    layout: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    broken_checkpoints: list[str] | None = None
    tracking: dict[str, Any] | None = None
    """Where rank 0 reported the run, per backend: {"where", "missed"} (null: the tracker has it all; else
    from which step it missed data). Written only when a backend is chosen (tracking.backends)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this version does not know (a newer writer's): kept as read, written back."""
    rank: int = 0
    """Not written: the rank whose run this is (another rank's is its own status, rank 0 writes the file)."""
    written: bool = True
    """Not written: False when nothing was written (the run directory belongs to another live job)."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of summary.json (before secrets are scrubbed and metrics filled: write_summary)."""
        out: dict[str, Any] = {
            "schema": self.schema,
            "status": str(self.status),
            "failure": None if self.failure is None else self.failure.to_json(),
            "overrides": list(self.overrides),
            "config_hash": self.config_hash,
            "config": self.config,
            "metrics": self.metrics,
        }
        for name in OPTIONAL_KEYS:
            value = getattr(self, name)
            if value is not None or (name == "resumed_from_step" and self.plan is not None):
                out[name] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Summary:
        """A summary.json's object; SummaryUnreadable when it breaks the contract. Files of every earlier
        version read (a failure with two fields or five, any of the optional keys)."""
        if not isinstance(obj, dict):
            raise SummaryUnreadable("summary.json is not a JSON object")
        if obj.get("schema") != SCHEMA:
            raise SummaryUnreadable(f"summary.json schema is {obj.get('schema')!r}; this version reads schema {SCHEMA}")
        if obj.get("status") not in STATUSES:
            raise SummaryUnreadable(f"summary.json status is {obj.get('status')!r}; expected one of {', '.join(STATUSES)}")
        failure = obj.get("failure")
        if failure is not None and not (isinstance(failure, dict) and "kind" in failure):
            raise SummaryUnreadable("summary.json failure is not an object {kind, message}")
        if obj["status"] == Status.FAILED and failure is None:
            raise SummaryUnreadable("summary.json says failed but has no failure {kind, message}")
        for key, kind in (("metrics", dict), ("config", dict), ("overrides", list)):
            if not isinstance(obj.get(key) or kind(), kind):
                raise SummaryUnreadable(f"summary.json {key} is not a JSON {'object' if kind is dict else 'list'}")
        return cls(
            status=Status(obj["status"]), failure=None if failure is None else Failure.from_json(failure),
            overrides=[str(o) for o in obj.get("overrides") or []], config=dict(obj.get("config") or {}),
            metrics=dict(obj.get("metrics") or {}), config_hash=obj.get("config_hash"), schema=obj["schema"],
            **{name: obj.get(name) for name in OPTIONAL_KEYS},
            extra={k: v for k, v in obj.items() if k not in CORE_KEYS and k not in OPTIONAL_KEYS},
        )

    @property
    def completed(self) -> bool:
        return self.status == Status.COMPLETED


STATUSES = tuple(status.value for status in Status)
# The keys every summary.json has, and the optional ones, in the order they are written.
CORE_KEYS = ("schema", "status", "failure", "overrides", "config_hash", "config", "metrics")
OPTIONAL_KEYS = ("attempt", "written_by", "started_at", "ended_at", "wall_s", "device_seconds", "device_kind",
                 "resumed_from_step", "data", "layout", "plan", "broken_checkpoints", "tracking")


def write_summary(run_dir: Path, summary: Summary) -> Summary:
    """Write summary.json atomically: secrets scrubbed, config_hash computed where unset, every summary
    metric of INTERFACE.md present (null where the run has none). Returns the summary as written."""
    config = scrub_secrets(summary.config)
    metrics = {key: None for key in SUMMARY_METRIC_KEYS}
    metrics.update(summary.metrics)
    summary = dataclasses.replace(summary, config=config, overrides=scrub_overrides(list(summary.overrides)),
                                  config_hash=summary.config_hash or config_hash(config), metrics=metrics)
    record = scrub_secrets(finite_or_none(summary.to_json()))  # a failure's message may quote a value
    reserve = Path(run_dir) / SUMMARY_RESERVE
    try:
        write_json_atomic(Path(run_dir) / SUMMARY, record)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not reserve.exists():
            raise
        reserve.unlink()  # the disk is full: the space held for this moment
        write_json_atomic(Path(run_dir) / SUMMARY, record)
    reserve.unlink(missing_ok=True)
    return dataclasses.replace(summary, metrics=record["metrics"])


def rewrite_summary(run_dir: Path, summary: Summary, **changes: Any) -> Summary:
    """Write a summary read back from run_dir again with `changes` (e.g. `failure=`), keeping the rest."""
    return write_summary(run_dir, dataclasses.replace(summary, **changes))


def reserve_summary_space(run_dir: Path) -> None:
    """Hold SUMMARY_RESERVE_BYTES for summary.json until it is written (best effort)."""
    try:
        with open(Path(run_dir) / SUMMARY_RESERVE, "wb") as f:
            f.write(b"\0" * SUMMARY_RESERVE_BYTES)
    except OSError:
        pass


def load_summary(run_dir: Path) -> Summary:
    """run_dir's summary.json; FileNotFoundError when there is none, SummaryUnreadable (one line) when it
    is not a summary: not JSON, or not INTERFACE.md's record."""
    path = Path(run_dir) / SUMMARY
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SummaryUnreadable(f"summary.json is not valid JSON ({error})") from None
    return Summary.from_json(obj)


def read_summary(run_dir: Path, attempt: str | None = None) -> Summary | None:
    """run_dir's summary, None when there is none (or it cannot be read). `attempt`: only the summary that
    attempt wrote, None while it has not written one (an earlier attempt's is not it)."""
    try:
        summary = load_summary(run_dir)
    except (OSError, SummaryUnreadable):
        return None
    if attempt is not None and summary.attempt != attempt:
        return None
    return summary
