"""What SLURM and the job's tasks say about a job that ended without rank 0's summary: the failure kind of
its state (sacct), the tasks srun reports ended abnormally, and the first rank that died.

The launchers' collecting (launchers/collect.py) asks these of every job; a job of the local launcher has
no SLURM state and no srun log, and gets a crash or what its ranks recorded.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.rundir.rank_failures import RankReport, first_failure
from dpo_sweeps.rundir.summary import Summary, rewrite_summary
from dpo_sweeps.runtime.watchdog import STALE_S, beat_position, read_heartbeats

# SLURM job states (sacct) and the summary.json failure.kind each means.
STATE_KINDS = {"TIMEOUT": "timeout", "PREEMPTED": "preempted", "OUT_OF_MEMORY": "oom", "DEADLINE": "timeout",
               "NODE_FAIL": "node_failure"}


def name_the_dead_rank(run_dir: Path, summary: Summary, submitted: Any) -> None:
    """Rank 0 saw only that a peer went away; say which rank failed first (its record, if it came
    late, else the first task of the job that ended without a result), and what SLURM says of the
    job (an out-of-memory kill, the time limit)."""
    failure = summary.failure
    if failure is None or not failure.started or failure.rank is not None:  # the failed rank is known
        return
    # the node each rank ran on, where the run got as far as recording it (summary.json "layout")
    nodes = {r["rank"]: r["node"] for r in (summary.layout or {}).get("ranks", [])}
    ended = []
    for i in range(1, getattr(submitted, "num_tasks", 1)):
        task = submitted.task(i)
        if not task.paths.result_pickle.exists():
            where = f" on node {nodes[i]}" if i in nodes else ""
            ended.append((i, f"rank {i} ended abruptly{where} (log: {task.paths.stderr})"))
    found = first_failure(run_dir, ended)
    if found is None:
        return
    rewritten = found.failure
    if found.reported_by is None:  # no rank recorded why: what the job's tasks and SLURM say
        state = state_of(submitted)
        rewritten = dataclasses.replace(
            rewritten, kind=FailureKind(STATE_KINDS.get(state.split()[0] if state else "", failure.kind)),
            message=f"{found.failure.message}; rank 0 saw: {failure.message}", step=failure.step)
    rewrite_summary(run_dir, summary, failure=rewritten)


def state_of(submitted: Any) -> str:
    try:
        return str(submitted.state)
    except Exception:
        return "UNKNOWN"


# srun's line for tasks that ended abnormally, e.g. "srun: error: node2: tasks 2-3: Killed".
SRUN_TASK_END = re.compile(r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9,\-]+): (?P<how>.+)$", re.M)


def first_dead_tasks(log_text: str) -> tuple[str, list[int], str] | None:
    """The node, ranks and way of ending of the first tasks srun reports ended abnormally in a job's log."""
    found = SRUN_TASK_END.search(log_text)
    if found is None:
        return None
    ranks: list[int] = []
    for part in found["tasks"].split(","):
        low, _, high = part.partition("-")
        ranks.extend(range(int(low), int(high or low) + 1))
    return found["node"], ranks, found["how"].strip()


def ended_in_srun_log(submitted: Any) -> list[tuple[int, str]]:
    """The first tasks srun reports ended abnormally, as first_failure's `ended` (none: no such line)."""
    try:  # the batch step's stderr, where srun writes, is task 0's log file
        first = first_dead_tasks(Path(submitted.paths.stderr).read_text(errors="replace"))
    except (OSError, AttributeError, ValueError):
        return []
    if first is None:
        return []
    node, ranks, how = first
    return [(r, f"rank {r} ended abruptly on node {node} ({how})") for r in ranks]


def lost_node_report(run_dir: Path, stale_s: float = STALE_S) -> RankReport | None:
    """The node lost first, read from the ranks' heartbeats, for a job SLURM ended NODE_FAIL before any
    rank recorded why (the survivors were still waiting in a collective when SLURM killed them): the
    node whose ranks all stopped beating at least `stale_s` before any rank of another node did. Its
    first rank is the failed one. None when the heartbeats do not tell (one node, or all stopped
    within `stale_s` of each other)."""
    beats = read_heartbeats(run_dir)
    by_host: dict[str, list[int]] = {}
    for rank, beat in beats.items():
        by_host.setdefault(str(beat.get("host")), []).append(rank)
    if len(by_host) < 2:
        return None
    last = {host: max(beats[r]["time"] for r in ranks) for host, ranks in by_host.items()}
    lost = min(last, key=last.__getitem__)
    gap = min(t for host, t in last.items() if host != lost) - last[lost]
    if gap < stale_s:
        return None
    ranks = sorted(by_host[lost])
    beat = max((beats[r] for r in ranks), key=lambda b: b["time"])
    listed = ", ".join(map(str, ranks))
    message = (f"rank {ranks[0]} lost with its node {lost} (ranks {listed} there): their heartbeats stopped "
               f"{gap:.0f} s before the other nodes' ranks, the last at {beat_position(beat)}")
    return RankReport(Failure(FailureKind.NODE_FAILURE, message, rank=ranks[0], step=beat.get("step")),
                      reported_by=None)
