"""A surviving rank's take-over of a lost rank 0's summary, on real files, a real watchdog thread and the
real run directory lock (no processes: rank 0's heartbeat is written here as a live or dead rank 0 leaves it)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.rundir.lock import RunDirLock
from dpo_sweeps.rundir.summary import Status, Summary, write_summary
from dpo_sweeps.runtime.lost_rank0 import (
    lost_rank0_failure,
    rank0_last_beat,
    summary_version,
    write_for_lost_rank0,
)
from dpo_sweeps.runtime.watchdog import Watchdog, heartbeat_dir

PEER_GONE = Failure(FailureKind.CRASH, "rank 2: Connection closed by peer [10.147.14.11]:4242", rank=2,
                    cause="Connection closed by peer [10.147.14.11]:4242")


def failed(failure: Failure) -> Summary:
    return Summary(Status.FAILED, failure, [], {}, {})


def summary_failure(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())["failure"]


class Rank0:
    """Rank 0's heartbeat file, advanced as its watchdog thread would while `beating`."""

    def __init__(self, run_dir):
        self.path = heartbeat_dir(run_dir) / "rank0.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.alive, self.beating = 0, threading.Event()
        self.beating.set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._done = threading.Event()

    def write(self) -> None:
        self.alive += 1
        self.path.write_text(json.dumps({"rank": 0, "pid": 1, "host": "dpo-n1", "alive": self.alive, "progress": 7,
                                         "step": 3, "phase": "backward", "armed": True, "time": time.time()}))

    def _run(self) -> None:
        while not self._done.wait(0.2):
            if self.beating.is_set():
                self.write()

    def __enter__(self) -> Rank0:
        self.write()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


@pytest.fixture
def rank2(tmp_path):
    """Rank 2 of 4's watchdog, reading rank 0's heartbeat every second."""
    watchdog = Watchdog(tmp_path, rank=2, world_size=4, bound_s=600, on_verdict=lambda verdict: None).start()
    yield watchdog
    watchdog.stop()


def never() -> bool:
    return False


class LateStop:
    """A stop signal that comes only after `polls` looks (about 20 s of the wait's): a wait it ends did not
    end for the reason under test."""

    def __init__(self, polls: int = 100):
        self.polls, self.came = polls, False

    def __call__(self) -> bool:
        self.polls -= 1
        self.came = self.polls <= 0
        return self.came


def test_rank0_whose_heartbeat_stops_is_found_gone_with_its_node_and_step(tmp_path, rank2):
    before = summary_version(tmp_path)
    with Rank0(tmp_path) as rank0:
        time.sleep(1.5)
        rank0.beating.clear()  # killed: its file stays as it last wrote it
        beat = rank0_last_beat(tmp_path, rank2, before, never, wait_s=10, stale_s=1.5)
    assert beat is not None and (beat["host"], beat["step"]) == ("dpo-n1", 3)
    failure = lost_rank0_failure(beat, PEER_GONE, reporter=2)
    assert (failure.kind, failure.rank, failure.step) == (FailureKind.CRASH, 0, 3)
    assert failure.message.startswith("rank 0 ended abruptly on node dpo-n1 (")
    assert "step 3 (backward)" in failure.message
    assert failure.message.endswith("rank 2 saw: Connection closed by peer [10.147.14.11]:4242")


def test_rank0_still_beating_is_left_to_end_the_run_itself(tmp_path, rank2):
    before = summary_version(tmp_path)
    with Rank0(tmp_path):
        assert rank0_last_beat(tmp_path, rank2, before, never, wait_s=3, stale_s=1.5) is None


def test_the_wait_ends_as_soon_as_rank0_writes_its_summary_or_a_stop_signal_comes(tmp_path, rank2):
    before = summary_version(tmp_path)
    with Rank0(tmp_path):
        signal_came = LateStop(polls=1)
        assert rank0_last_beat(tmp_path, rank2, before, signal_came, wait_s=600) is None and signal_came.came
        write_summary(tmp_path, failed(Failure(FailureKind.CRASH, "rank 3: x")))
        late = LateStop()
        assert rank0_last_beat(tmp_path, rank2, before, late, wait_s=600) is None and not late.came


def test_a_heartbeat_removed_means_rank0_stopped_in_order(tmp_path, rank2):
    before = summary_version(tmp_path)
    with Rank0(tmp_path) as rank0:
        time.sleep(1.5)
        rank0.beating.clear()
        rank0.path.unlink()  # Watchdog.stop()
        late = LateStop()
        assert rank0_last_beat(tmp_path, rank2, before, late, wait_s=600, stale_s=600) is None and not late.came


def test_the_summary_is_written_by_one_rank_and_never_while_rank0_holds_the_lock(tmp_path):
    write_summary(tmp_path, failed(Failure(FailureKind.PREEMPTED, "an earlier attempt")))
    before = summary_version(tmp_path)
    failure = lost_rank0_failure({"host": "dpo-n1", "step": 3, "phase": "forward"}, PEER_GONE, reporter=2)

    def write() -> Summary:
        return write_summary(tmp_path, failed(failure))

    rank0_lock = RunDirLock(tmp_path).acquire()  # rank 0 stopped, not dead: it still holds the lock
    assert write_for_lost_rank0(tmp_path, write, before) is None
    assert summary_failure(tmp_path)["kind"] == "preempted"
    rank0_lock.release()  # rank 0 died: the kernel frees its lock
    assert write_for_lost_rank0(tmp_path, write, before).failure == failure
    assert summary_failure(tmp_path) == failure.to_json()
    written = summary_version(tmp_path)
    assert write_for_lost_rank0(tmp_path, write, before) is None  # rank 3, later: rank 2 wrote it
    assert summary_version(tmp_path) == written
    RunDirLock(tmp_path).acquire().release()  # and the lock is free again for the launcher
