"""rank_failures/rankN.json: what each rank saw of a failure, and which rank failed first on its own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.rundir.atomic import write_json_atomic

RANK_FAILURES = "rank_failures"


def write_rank_failure(run_dir: Path, reported_by: int, failure: dict, *, collective: bool) -> None:
    """Record what rank `reported_by` saw: its own failure (`failure` without a `rank`), or a verdict
    about another rank (a hang). `collective`: it only saw a peer go away. Best effort: a full disk
    must not hide the failure being handled."""
    import time

    record = dict(failure)
    if record.get("rank") is None:  # this rank's own failure
        record.update(rank=reported_by, cause=failure["message"], message=f"rank {reported_by}: {failure['message']}")
    record.update(reported_by=reported_by, time=time.time(), collective=collective)
    try:
        write_json_atomic(Path(run_dir) / RANK_FAILURES / f"rank{reported_by}.json", record)
    except OSError:
        pass


def read_rank_failures(run_dir: Path) -> list[dict]:
    folder = Path(run_dir) / RANK_FAILURES
    out = []
    for path in sorted(folder.glob("rank*.json")) if folder.exists() else []:
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out

FAILURE_FIELDS = ("kind", "message", "rank", "step", "cause")


def first_failure(run_dir: Path, ended: Sequence[tuple[int, str]] = ()) -> dict | None:
    """The failure of the rank that failed first on its own: the one place that works it out.

    By evidence, best first: the earliest failure a rank recorded of itself; else the earliest verdict
    about a rank (a hang); else the first of `ended`, the ranks a supervisor saw end without saying why,
    as (rank, how it ended) in the order seen (exit codes, tasks without a result, srun's log). Ranks
    that only saw a peer go away never count. `reported_by` is the rank that recorded it (None: it
    comes from `ended`). None: nobody knows.
    """
    reports = [r for r in read_rank_failures(run_dir) if not r.get("collective")]
    own = [r for r in reports if r.get("rank") == r.get("reported_by")]
    found = min(own or reports, key=lambda r: r["time"], default=None)
    if found is not None:
        return {k: found.get(k) for k in (*FAILURE_FIELDS, "reported_by")}
    if not ended:
        return None
    message = "; ".join(how for _, how in ended)
    return {**Failure(FailureKind.CRASH, message, rank=ended[0][0]).record(), "reported_by": None}
