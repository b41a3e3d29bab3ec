"""The watchdog's judgements on real files, without processes: who held the others up, which
failure started it, and what a launcher concludes from heartbeats alone."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.checks.validate import validate_config
from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import Failure, FailureKind, InvalidConfig
from dpo_sweeps.rundir.rank_failures import first_failure, write_rank_failure
from dpo_sweeps.runtime.watchdog import hang_failure, hang_verdict, heartbeat_dir


def beat(rank: int, progress: int, step: int, phase: str, **extra) -> dict:
    return {"rank": rank, "pid": 1, "host": "h", "alive": 1, "progress": progress, "step": step, "phase": phase,
            "armed": True, "time": time.time(), **extra}


def test_the_rank_furthest_behind_is_the_hung_one():
    beats = {0: beat(0, 9, 3, "backward"), 1: beat(1, 8, 3, "forward"), 2: beat(2, 9, 3, "backward")}
    failure = hang_failure(beats, stale=set(), bound_s=10)
    assert (failure.kind, failure.rank, failure.step) == ("hang", 1, 3)
    assert failure.message == "rank 1 made no progress at step 3 (forward) for 10 s (resources.hang_timeout_s)"


def test_a_stopped_rank_is_named_before_the_ones_behind():
    beats = {0: beat(0, 7, 3, "forward"), 1: beat(1, 9, 3, "backward")}
    failure = hang_failure(beats, stale={1}, bound_s=10)
    assert failure.rank == 1 and "stopped responding" in failure.message


def test_the_first_own_failure_wins_over_verdicts_and_lost_peers(tmp_path):
    write_rank_failure(tmp_path, 0, Failure(FailureKind.CRASH, "peer went away"), collective=True)
    assert first_failure(tmp_path) is None
    write_rank_failure(tmp_path, 2, hang_failure({1: beat(1, 1, 4, "forward")}, set(), 10), collective=False)
    assert first_failure(tmp_path).failure.kind == "hang"
    write_rank_failure(tmp_path, 1, Failure(FailureKind.OOM, "OutOfMemoryError: x"), collective=False)
    found = first_failure(tmp_path).failure
    assert (found.kind, found.rank, found.cause, found.message) == (
        "oom", 1, "OutOfMemoryError: x", "rank 1: OutOfMemoryError: x")
    # The file is INTERFACE.md's rank_failures/rank1.json: the failure's five fields and who recorded it.
    assert set(json.loads((tmp_path / "rank_failures" / "rank1.json").read_text())) == {
        "kind", "message", "rank", "step", "cause", "reported_by", "time", "collective"}


def test_ranks_seen_ending_name_the_failure_only_when_no_rank_recorded_one(tmp_path):
    ended = [(3, "rank 3 killed by SIGKILL"), (1, "rank 1 exited with 1")]
    write_rank_failure(tmp_path, 0, Failure(FailureKind.CRASH, "peer went away"), collective=True)
    found = first_failure(tmp_path, ended)
    assert (found.failure.kind, found.failure.rank, found.reported_by, found.failure.message) == (
        "crash", 3, None, "rank 3 killed by SIGKILL; rank 1 exited with 1")
    write_rank_failure(tmp_path, 1, Failure(FailureKind.OOM, "OutOfMemoryError: x"), collective=False)
    found = first_failure(tmp_path, ended)
    assert (found.failure.kind, found.failure.rank, found.reported_by) == ("oom", 1, 1)


def test_a_launcher_sees_a_hang_only_when_every_heartbeat_is_old(tmp_path):
    folder = heartbeat_dir(tmp_path)
    folder.mkdir()
    old = time.time() - 60
    (folder / "rank0.json").write_text(json.dumps(beat(0, 5, 2, "forward", time=old)))
    assert hang_verdict(tmp_path, 30, world_size=2) is None  # rank 1 has not started
    (folder / "rank1.json").write_text(json.dumps(beat(1, 5, 2, "forward", time=time.time())))
    assert hang_verdict(tmp_path, 30, world_size=2) is None  # rank 1's watchdog still runs
    (folder / "rank1.json").write_text(json.dumps(beat(1, 5, 2, "forward", time=old)))
    assert hang_verdict(tmp_path, 30, world_size=2).kind == "hang"


def test_heartbeats_an_earlier_attempt_left_are_not_the_new_jobs(tmp_path):
    """Ranks killed outright leave their heartbeats; a rerun's job must not be judged hung by them the moment
    it starts (a SmolLM2 sweep's rerun was cancelled so, its new ranks not yet up)."""
    folder = heartbeat_dir(tmp_path)
    folder.mkdir()
    old = time.time() - 600
    for rank in (0, 1):
        (folder / f"rank{rank}.json").write_text(json.dumps(beat(rank, 5, 32, "eval", time=old)))
    assert hang_verdict(tmp_path, 30, world_size=2).kind == "hang"  # the earlier attempt's own verdict
    assert hang_verdict(tmp_path, 30, world_size=2, since=time.time() - 1) is None  # a job started just now


def test_hang_timeout_must_be_a_positive_number():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["resources.hang_timeout_s=0"])
    with pytest.raises(InvalidConfig, match=r"resources.hang_timeout_s: got 0 \(accepted: a number of seconds > 0"):
        validate_config(Config.of(OmegaConf.to_container(cfg, resolve=True)), Path("."))


def test_an_unknown_fault_kind_is_refused_before_launch():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["faults.kind=explode"])
    with pytest.raises(InvalidConfig, match=r"faults.kind: unknown fault 'explode' \(accepted: null, nan_loss, crash"):
        validate_config(Config.of(OmegaConf.to_container(cfg, resolve=True)), Path("."))
