"""rank_failures/rankN.json: what each rank saw of a failure, and which rank failed first on its own."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.rundir.atomic import write_json_atomic

RANK_FAILURES = "rank_failures"


@dataclass(frozen=True)
class RankReport:
    """rank_failures/rankN.json (INTERFACE.md): a failure as rank `reported_by` saw it, its own or its
    verdict about another rank (a hang); or, from first_failure, what a supervisor saw end (reported_by
    None)."""

    failure: Failure
    reported_by: int | None
    time: float = 0.0
    collective: bool = False
    """It only saw a peer go away: the cause is another rank's."""

    def to_json(self) -> dict:
        return {**self.failure.to_json(), "reported_by": self.reported_by, "time": self.time,
                "collective": self.collective}

    @classmethod
    def from_json(cls, record: dict) -> RankReport:
        return cls(Failure.from_json(record), record.get("reported_by"), float(record.get("time") or 0.0),
                   bool(record.get("collective")))


def write_rank_failure(run_dir: Path, reported_by: int, failure: Failure, *, collective: bool) -> None:
    """Record what rank `reported_by` saw: its own failure (`failure` without a `rank`), or a verdict
    about another rank (a hang). `collective`: it only saw a peer go away. Best effort: a full disk
    must not hide the failure being handled."""
    if failure.rank is None:  # this rank's own failure
        failure = dataclasses.replace(failure, rank=reported_by, cause=failure.message,
                                      message=f"rank {reported_by}: {failure.message}")
    report = RankReport(failure, reported_by, time.time(), collective)
    try:
        write_json_atomic(Path(run_dir) / RANK_FAILURES / f"rank{reported_by}.json", report.to_json())
    except OSError:
        pass


def read_rank_failures(run_dir: Path) -> list[RankReport]:
    folder = Path(run_dir) / RANK_FAILURES
    out = []
    for path in sorted(folder.glob("rank*.json")) if folder.exists() else []:
        try:
            out.append(RankReport.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, AttributeError):
            continue
    return out


def first_failure(run_dir: Path, ended: Sequence[tuple[int, str]] = ()) -> RankReport | None:
    """The failure of the rank that failed first on its own: the one place that works it out.

    By evidence, best first: the earliest failure a rank recorded of itself; else the earliest verdict
    about a rank (a hang); else the first of `ended`, the ranks a supervisor saw end without saying why,
    as (rank, how it ended) in the order seen (exit codes, tasks without a result, srun's log). Ranks
    that only saw a peer go away never count. `reported_by` is the rank that recorded it (None: it
    comes from `ended`). None: nobody knows.
    """
    reports = [r for r in read_rank_failures(run_dir) if not r.collective]
    own = [r for r in reports if r.failure.rank == r.reported_by]
    found = min(own or reports, key=lambda r: r.time, default=None)
    if found is not None:
        return found
    if not ended:
        return None
    message = "; ".join(how for _, how in ended)
    return RankReport(Failure(FailureKind.CRASH, message, rank=ended[0][0]), reported_by=None)
