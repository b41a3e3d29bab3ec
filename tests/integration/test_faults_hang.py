"""Hung and failing ranks end the run on every launcher, without waiting for a collective to time
out: kind `hang` (or the failing rank's kind) naming the rank and the step, within
resources.collective_timeout_s + 30 s, a summary.json written, and no rank process left.

A stopped rank under self-spawned ranks here, a crash and a hang under torchrun; a hung rank under
the local launcher is in tests/integration/test_faults.py (the fault matrix), under SLURM in
tests/integration/test_faults_slurm.py."""

from __future__ import annotations

import os
import shutil
import signal
import sys

import pytest
from support.faults import HANG_BOUND, SHORT, dpo, fault_to_summary, injected_at, run_watched, summary_of

from dpo_sweeps.parallel.rank_env import free_port

pytestmark = pytest.mark.slow
COLLECTIVE_TIMEOUT_S = 120  # HANG_BOUND's


def sigstop_at_step(rank: int, step: int):
    """An `act` for run_watched: SIGSTOP `rank` once its heartbeat says it reached `step`."""
    def act(beats: dict) -> bool:
        beat = beats.get(rank)
        if beat is None or (beat["step"] or 0) < step:
            return False
        os.kill(beat["pid"], signal.SIGSTOP)
        return True

    return act


def test_a_stopped_rank_is_found_and_killed(tmp_path):
    """SIGSTOP of rank 1 at step 2: its heartbeat stops; rank 0 names it, kills it and writes the summary."""
    run_dir = tmp_path / "run"

    run = run_watched(dpo("resources.nproc_per_node=2", "train.max_steps=40", *HANG_BOUND, run_dir=run_dir),
                      lambda: [run_dir], act=sigstop_at_step(rank=1, step=2))
    assert run.acted_at is not None and run.returncode == 1, run.output[-3000:]
    failure = summary_of(run_dir)["failure"]
    assert failure["kind"] == "hang" and failure["rank"] == 1 and failure["step"] >= 2, failure
    assert "stopped responding" in failure["message"]
    seconds = fault_to_summary(run_dir, run.acted_at, "SIGSTOP (self-spawned ranks)",
                               "tests/integration/test_faults_hang.py::test_a_stopped_rank_is_found_and_killed")
    assert seconds < COLLECTIVE_TIMEOUT_S + 30
    assert run.alive() == []


def test_a_job_whose_only_rank_is_stopped_is_cancelled_by_the_local_launcher(tmp_path):
    """No watchdog runs in a stopped process: the local launcher sees every heartbeat of the job go
    stale, cancels the job and writes its `hang` summary."""
    sweep_dir = tmp_path / "sweep"

    args = [sys.executable, "-m", "dpo_sweeps", "-m", *SHORT, "train.max_steps=40", *HANG_BOUND,
            f"hydra.sweep.dir={sweep_dir}"]
    run = run_watched(args, lambda: [sweep_dir / "0"], act=sigstop_at_step(rank=0, step=2))
    assert run.acted_at is not None and run.returncode != 0, run.output[-3000:]
    failure = summary_of(sweep_dir / "0")["failure"]
    assert failure["kind"] == "hang" and failure["rank"] == 0 and failure["step"] >= 2, failure
    assert "failed     1  (hang: 1)" in run.output
    seconds = fault_to_summary(sweep_dir / "0", run.acted_at, "SIGSTOP of a 1-rank job (local launcher)",
                               "tests/integration/test_faults_hang.py::"
                               "test_a_job_whose_only_rank_is_stopped_is_cancelled_by_the_local_launcher")
    assert seconds < COLLECTIVE_TIMEOUT_S + 30
    assert run.alive() == []


def torchrun(*overrides: str, run_dir) -> list[str]:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    return [exe, "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "dpo_sweeps", *SHORT, "faults.step=3",
            *overrides, f"hydra.run.dir={run_dir}"]


@pytest.mark.parametrize("fault", ["crash", "hang"])
def test_under_torchrun_a_failing_or_hung_rank_still_gets_its_summary(tmp_path, fault):
    """torchrun kills the other ranks once one exits: rank 0 must have written summary.json by then."""
    run_dir = tmp_path / "run"
    run = run_watched(torchrun(f"faults.kind={fault}", "faults.rank=1", *HANG_BOUND, run_dir=run_dir),
                      lambda: [run_dir])
    assert run.returncode != 0
    assert (run_dir / "summary.json").exists(), run.output[-3000:]
    failure = summary_of(run_dir)["failure"]
    assert (failure["rank"], failure["step"]) == (1, 3), failure
    if fault == "crash":
        assert failure["kind"] == "crash" and failure["cause"] == "RuntimeError: injected crash at step 3 on rank 1"
        fault_at = min(r.time for r in _reports(run_dir) if r.reported_by == 1)
    else:
        assert failure["kind"] == "hang"
        fault_at = injected_at(run.output, "hang")
    seconds = fault_to_summary(run_dir, fault_at, f"{fault} (torchrun)",
                               f"tests/integration/test_faults_hang.py::test_under_torchrun_a_failing_or_hung_rank_still_gets_its_summary[{fault}]")
    assert seconds < COLLECTIVE_TIMEOUT_S + 30
    assert len(run.marked) >= 2 and run.alive() == []  # both ranks ran (a 0.2 s poll may miss a heartbeat)


def _reports(run_dir):
    from dpo_sweeps.rundir.rank_failures import read_rank_failures

    return read_rank_failures(run_dir)
