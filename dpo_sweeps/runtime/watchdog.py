"""Every rank watches the others through the run directory, so a failed or hung rank ends the run
within seconds on any launcher and any backend (NCCL blocks a collective until its timeout, and its
own watchdog then aborts the process with no Python error and no summary).

Each rank runs a `Watchdog` thread. Once a second it writes `<run dir>/heartbeats/rank<r>.json`:
`alive` (a counter the thread itself advances: it stops only when the process is stopped or gone)
and `progress` (a counter the training loop advances at each phase of each step, eval batch and
checkpoint, with that step). It reads `rank_failures/` and the heartbeats (rank 0 every rank's,
the other ranks rank 0's) and reaches a verdict when:

- another rank recorded a failure of its own (an exception): the run ends with that rank's failure,
  after `PEER_GRACE_S` in which this rank's own error handling may end it the ordinary way;
- no rank has made progress for `resources.hang_timeout_s` (null: `resources.collective_timeout_s`)
  since training started: the run ends with kind `hang`. The hung rank is one whose `alive` stopped
  (SIGSTOP, a lost process) or else the one furthest behind: ranks run the same phases in lockstep,
  so the others wait in a collective for the rank that has not reached it. Rank 0 judges and
  records its verdict in `rank_failures/`, which the others follow; they judge only when rank 0
  itself is the stopped one.

On a verdict rank 0 writes the failed summary.json (`on_verdict`) and every rank exits; a stopped
rank on this host is killed, as no signal it could handle reaches it. Launchers read the same files
(`hang_verdict`) for a job whose every rank is stopped.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.rundir.atomic import temporary_beside
from dpo_sweeps.rundir.rank_failures import first_failure, write_rank_failure

log = logging.getLogger(__name__)

HEARTBEATS = "heartbeats"
POLL_S = 1.0
# A rank whose watchdog thread has not written for this long is stopped or gone.
STALE_S = 10.0
# How long a rank's own error handling gets to end the run after a peer failed, before the watchdog does.
PEER_GRACE_S = 5.0
# After a verdict, how long a rank other than 0 waits before exiting (rank 0 writes the summary meanwhile).
EXIT_DELAY_S = 2.0


def heartbeat_dir(run_dir: Path) -> Path:
    return Path(run_dir) / HEARTBEATS


def read_heartbeats(run_dir: Path, rank: int | None = None) -> dict[int, dict]:
    """Every rank's heartbeat (or only `rank`'s), by rank."""
    out = {}
    folder = heartbeat_dir(run_dir)
    pattern = "rank*.json" if rank is None else f"rank{rank}.json"
    for path in folder.glob(pattern) if folder.is_dir() else []:
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[int(beat["rank"])] = beat
    return out


def _write_heartbeat(path: Path, beat: dict) -> None:
    """Atomic (a reader never sees half a file); no fsync: a heartbeat is worth one second."""
    tmp = temporary_beside(path)
    try:
        tmp.write_text(json.dumps(beat))
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: no half heartbeat left in the folder
        raise
    os.replace(tmp, path)


def beat_position(beat: dict) -> str:
    """Where a heartbeat says its rank was: "step 3 (backward)", or its phase alone before a first step."""
    step, phase = beat.get("step"), beat.get("phase")
    return f"step {step} ({phase})" if step is not None else str(phase)


def hang_failure(beats: dict[int, dict], stale: set[int], bound_s: float) -> Failure:
    """The `hang` failure for ranks that made no progress for bound_s: which rank held the others up."""
    if stale:
        culprits, how = sorted(stale), "stopped responding (its process is stopped or lost)"
    else:
        lowest = min(b["progress"] for b in beats.values())
        culprits, how = sorted(r for r, b in beats.items() if b["progress"] == lowest), "made no progress"
    rank = culprits[0]
    beat = beats[rank]
    who = f"rank {rank}" if len(culprits) == 1 else f"ranks {', '.join(map(str, culprits))}"
    cause = f"{who} {how} at step {beat['step']} ({beat['phase']}) for {bound_s:.0f} s (resources.hang_timeout_s)"
    return Failure(FailureKind.HANG, cause, rank=rank, step=beat["step"])


def hang_verdict(run_dir: Path, bound_s: float, world_size: int, since: float | None = None) -> Failure | None:
    """For a launcher on the ranks' host: the hang failure when every rank's heartbeat is older than
    bound_s (all stopped or hung with their watchdogs), else None. `since` (wall time): the job's start;
    a heartbeat from before it is an earlier attempt's, left by ranks that were killed, and not this job's."""
    beats = {rank: beat for rank, beat in read_heartbeats(run_dir).items()
             if since is None or beat.get("time", 0) >= since}
    if len(beats) < world_size or not all(b.get("armed") for b in beats.values()):
        return None
    now = time.time()
    if min(now - b["time"] for b in beats.values()) < bound_s:
        return None
    return hang_failure(beats, set(beats), bound_s)


class Watchdog:
    """This rank's heartbeat writer and watcher of its peers (a daemon thread)."""

    def __init__(self, run_dir: Path, rank: int, world_size: int, bound_s: float,
                 on_verdict: Callable[[Failure], None]):
        self.run_dir, self.rank, self.world_size, self.bound_s = Path(run_dir), rank, world_size, float(bound_s)
        self.on_verdict = on_verdict  # rank 0: write the failed summary (then this thread exits the process)
        self.path = heartbeat_dir(run_dir) / f"rank{rank}.json"
        self.verdict: Failure | None = None
        self.step: int | None = None  # the step this rank works on (None: before training)
        self.phase = "setup"
        self._progress = 0
        self._alive = 0
        self._armed = False
        self._seen: dict[int, tuple[int, int]] = {}  # rank -> (alive, progress) last read
        self._beats: dict[int, dict] = {}  # the heartbeats last read (a rank's is missing once it stopped in order)
        self._alive_at: dict[int, float] = {}  # rank -> when its alive counter last changed (our clock)
        self._progress_at = time.monotonic()  # when any rank's progress last changed
        self._verdict_at = 0.0
        self._reported = False
        self._stop = threading.Event()
        self._ending = threading.Lock()  # held by whichever of the rank's main thread and this one ends the run
        self._main_ends = False
        self._thread = threading.Thread(target=self._run, name=f"watchdog-rank{rank}", daemon=True)

    # ------------------------------------------------------------------ the training loop's side
    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def progress(self, step: int, phase: str) -> None:
        """The training loop reached `phase` of `step` (cheap: two assignments)."""
        self.step, self.phase = step, phase
        self._progress += 1
        self._armed = True

    def peer_beat(self, rank: int) -> tuple[dict | None, float | None]:
        """`rank`'s heartbeat as last read (None: there is none now, e.g. it stopped in order) and for how
        many seconds its `alive` counter has not moved (None: never seen). Rank 0 watches every rank,
        the others only rank 0."""
        seen_at = self._alive_at.get(rank)
        return self._beats.get(rank), None if seen_at is None else time.monotonic() - seen_at

    def begin_ending(self) -> None:
        """The rank's main thread ends the run itself (its summary, its clean-up, a requeue): no verdict
        acts from now on. Blocks for good when the watchdog is already ending the process."""
        if not self._main_ends:
            self._ending.acquire()
            self._main_ends = True

    def stop(self) -> None:
        """The rank is ending: no more verdicts; its heartbeat is removed."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * POLL_S)
        self.path.unlink(missing_ok=True)
        try:
            self.path.parent.rmdir()  # the last rank out removes the folder
        except OSError:
            pass

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._tick()
            except OSError as exc:  # a vanished run directory must not kill the watcher
                log.debug("watchdog: %s", exc)

    def _tick(self) -> None:
        self._alive += 1
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_heartbeat(self.path, {
                "rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "alive": self._alive,
                "progress": self._progress, "step": self.step, "phase": self.phase, "armed": self._armed,
                "time": time.time(),
            })
        except OSError as exc:  # a full disk: peers will see this rank as stale, which it is not
            log.debug("watchdog: cannot write %s: %s", self.path, exc)
        now = time.monotonic()
        # Rank 0 watches every rank; the others watch rank 0 (whose verdicts they follow), so a large
        # job's shared filesystem sees world_size reads a second, not world_size squared.
        beats = read_heartbeats(self.run_dir, None if self.rank == 0 else 0)
        for rank, beat in beats.items():
            seen = (beat["alive"], beat["progress"])
            before = self._seen.get(rank)
            if before is None or seen[0] != before[0]:
                self._alive_at[rank] = now
            if before is None or seen[1] != before[1]:
                self._progress_at = now
            self._seen[rank] = seen
        self._beats = beats
        if self.verdict is None:
            self.verdict = self._judge(beats, now)
            self._verdict_at = now
            if self.verdict is not None:
                log.error("watchdog of rank %d: %s", self.rank, self.verdict.message)
        if self.verdict is not None:
            self._act(beats, now)

    def _judge(self, beats: dict[int, dict], now: float) -> Failure | None:
        failed = first_failure(self.run_dir)
        if failed is not None and failed.reported_by != self.rank:
            return failed.failure
        expected = self.world_size if self.rank == 0 else 1
        armed = len(beats) == expected and all(b["armed"] for b in beats.values())
        if not armed or now - self._progress_at < self.bound_s:
            return None
        stale = {r for r in beats if now - self._alive_at[r] > STALE_S}
        if self.rank != 0 and not stale:
            return None  # rank 0 judges (and says so in rank_failures/), unless it is the one stopped
        return hang_failure(beats, stale, self.bound_s)

    def _act(self, beats: dict[int, dict], now: float) -> None:
        verdict = self.verdict
        assert verdict is not None
        hang = verdict.kind == FailureKind.HANG
        if not hang and now - self._verdict_at < PEER_GRACE_S:
            return
        if hang and not self._reported:
            self._reported = True
            write_rank_failure(self.run_dir, self.rank, verdict, collective=False)
            self._kill_stopped_peers(beats, now)
        if not self._ending.acquire(blocking=False):
            return  # the main thread is ending the run itself (its summary, a SLURM requeue): leave it be
        if self.rank == 0:
            self.on_verdict(verdict)
        else:
            time.sleep(EXIT_DELAY_S)
        log.error("rank %d ends: %s", self.rank, verdict.message)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(1)

    def _kill_stopped_peers(self, beats: dict[int, dict], now: float) -> None:
        host = socket.gethostname()
        for rank, beat in beats.items():
            if rank != self.rank and beat["host"] == host and now - self._alive_at[rank] > STALE_S:
                try:
                    os.kill(int(beat["pid"]), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
