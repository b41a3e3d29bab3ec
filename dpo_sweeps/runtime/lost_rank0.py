"""When rank 0 dies outright (its node lost, its process killed), a surviving rank writes the failed summary.

Rank 0 writes summary.json and holds the run directory's lock (rundir/lock.py). Killed with its node it
writes nothing, and a launcher learns of it late: SLURM marks a lost node down only after
`SlurmdTimeout`, and the job's batch step, which would have said which tasks died, was on that node too.
So a rank other than 0 that saw a peer go away (a collective error) does not leave at once:

- while rank 0's heartbeat goes on, rank 0 ends the run itself; the rank leaves once rank 0's
  summary of this attempt is there or rank 0's heartbeat is removed (a rank that stops in order
  removes it);
- when rank 0's heartbeat stops for `watchdog.STALE_S`, rank 0 is gone: the surviving rank that takes
  the run directory's lock first writes the failed summary, naming rank 0 and the node it ran on
  (its heartbeat's host), unless this attempt's summary is there by then (rank 0 was late, or
  another surviving rank wrote it). The others find it written and leave.

The lock keeps one writer at a time: rank 0 holds it while it lives, even stopped (SIGSTOP), and the
kernel or the file system's lock manager frees it when rank 0 dies. Where it is not freed in time (a
file system without flock whose holder was on another host), no rank writes and the launcher writes
the summary, as it does when no rank is left. A stop signal (srun tearing the job step down, a
scancel) ends the wait at once: the launcher then names the dead ranks from what it saw.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock
from dpo_sweeps.rundir.summary import SUMMARY, Summary
from dpo_sweeps.runtime.watchdog import POLL_S, STALE_S, Watchdog, beat_position

log = logging.getLogger(__name__)

# How long a rank waits for rank 0 to end the run or be found gone: the staleness bound, and a few of
# the watchdog's reads for its last read of rank 0 to be old enough.
WAIT_S = STALE_S + 3 * POLL_S


def summary_version(run_dir: Path) -> tuple[int, int] | None:
    """Which summary.json is in run_dir now (None: none), to tell this attempt's from an earlier one."""
    try:
        stat = (Path(run_dir) / SUMMARY).stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def rank0_last_beat(run_dir: Path, watchdog: Watchdog, summary_before: tuple[int, int] | None,
                    ending: Callable[[], bool], wait_s: float = WAIT_S, stale_s: float = STALE_S) -> dict | None:
    """Rank 0's last heartbeat once it has stopped for `stale_s` (rank 0 is gone); None when rank 0 ended
    the run itself (a new summary.json, its heartbeat removed), `ending()` says a stop signal came, or
    `wait_s` passed with rank 0 still beating (it is alive: it will end the run itself)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not ending():
        if summary_version(run_dir) != summary_before:
            return None
        beat, still_for = watchdog.peer_beat(0)
        if beat is None and still_for is not None:
            return None  # its heartbeat was there and is gone: rank 0 stopped its watchdog in order
        if beat is not None and still_for is not None and still_for > stale_s:
            return beat
        time.sleep(POLL_S / 5)
    return None


def lost_rank0_failure(beat: dict, own: Failure, reporter: int) -> Failure:
    """The failure of a run whose rank 0 ended without a word (`beat`: its last heartbeat), as the
    surviving rank `reporter` writes it (`own`: what that rank itself saw, a peer going away)."""
    message = (f"rank 0 ended abruptly on node {beat.get('host') or '?'} (no heartbeat for {STALE_S:.0f} s, "
               f"the last at {beat_position(beat)}; it wrote no summary); rank {reporter} saw: "
               f"{own.cause or own.message}")
    return Failure(FailureKind.CRASH, message, rank=0, step=beat.get("step"))


def write_for_lost_rank0(run_dir: Path, write: Callable[[], Summary],
                         summary_before: tuple[int, int] | None) -> Summary | None:
    """Write this attempt's summary (`write()`) in place of a rank 0 that is gone, holding the run
    directory's lock; None when the lock is held (rank 0 is not gone after all, or another surviving
    rank is writing) or the summary was written meanwhile."""
    try:
        lock = RunDirLock(run_dir).acquire()
    except RunDirInUse:
        return None
    try:
        if summary_version(run_dir) != summary_before:
            return None
        return write()
    finally:
        lock.release()


def take_over_from_lost_rank0(run_dir: Path, watchdog: Watchdog, summary_before: tuple[int, int] | None,
                              own: Failure, reporter: int, write: Callable[[Failure], Summary],
                              ending: Callable[[], bool]) -> Summary | None:
    """For a rank other than 0 that saw a peer go away (`own`, its failure): the summary it wrote in place of
    rank 0 (`write(failure)` writes it), or None when rank 0 is alive or someone else wrote it."""
    beat = rank0_last_beat(run_dir, watchdog, summary_before, ending)
    if beat is None:
        return None
    failure = lost_rank0_failure(beat, own, reporter)
    summary = write_for_lost_rank0(run_dir, lambda: write(failure), summary_before)
    if summary is not None:
        log.error("rank %d (pid %d) wrote the failed summary in place of rank 0: %s", reporter, os.getpid(),
                  failure.message)
    return summary
