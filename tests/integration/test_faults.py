"""The fault matrix: every injected fault kind in one real sweep (local launcher, 2 ranks per run,
the fault on rank 1 at step 4, a checkpoint every 2 steps). Each run's summary.json records its
outcome with the failing rank and step, the earlier files and checkpoint are kept, the healthy run
completes, the sweep screen counts them, and no rank process is left.

Elsewhere: `timeout` and `preempted` (stops, not faults) in tests/integration/test_checkpoint.py; broken
checkpoints in tests/integration/test_faults_checkpoint.py; a full disk in tests/integration/test_faults_disk.py; hung and
stopped ranks under self-spawned ranks and torchrun in tests/integration/test_faults_hang.py."""

from __future__ import annotations

import json
import sys

import pytest
from support import QUIET
from support.faults import HANG_BOUND, fault_to_summary, injected_at, run_watched, summary_of

from dpo_sweeps.rundir.rank_failures import read_rank_failures

pytestmark = pytest.mark.slow

KINDS = ("null", "nan_loss", "crash", "oom", "sigkill", "hang", "sigkill_in_checkpoint")
MATRIX = "tests/integration/test_faults.py::test_each_fault_kind_is_recorded_and_the_sweep_goes_on"
# kind -> (summary failure.kind, failure.rank, failure.step); a killed rank's step is rank 0's
EXPECTED = {
    "nan_loss": ("nan", 0, 4),  # every rank sees the reduced loss; rank 0 reports it
    "crash": ("crash", 1, 4),
    "oom": ("oom", 1, 4),
    "sigkill": ("crash", 1, 4),
    "hang": ("hang", 1, 4),
    "sigkill_in_checkpoint": ("crash", 1, 4),
}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("faults") / "sweep"
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *QUIET, "data.num_train_pairs=256", "data.num_eval_pairs=32",
            "train.max_steps=5", "train.eval_every=0", "checkpoint.every_steps=2", "faults.step=4", "faults.rank=1",
            "resources.nproc_per_node=2", *HANG_BOUND, f"faults.kind={','.join(KINDS)}",
            f"hydra.sweep.dir={sweep_dir}"]
    run = run_watched(args, lambda: [p for p in sweep_dir.glob("[0-9]*") if p.is_dir()], timeout=900)
    runs = {summary_of(p)["config"]["faults"]["kind"]: p
            for p in sweep_dir.glob("[0-9]*") if (p / "summary.json").exists()}
    return run, runs, sweep_dir


def test_each_fault_kind_is_recorded_and_the_sweep_goes_on(matrix):
    run, runs, sweep_dir = matrix
    assert run.returncode != 0  # the sweep says some runs failed
    assert set(runs) == {None, *EXPECTED}, run.output[-3000:]
    assert summary_of(runs[None])["status"] == "completed" and summary_of(runs[None])["metrics"]["steps"] == 5
    for kind, (recorded, rank, step) in EXPECTED.items():
        failure = summary_of(runs[kind])["failure"]
        assert summary_of(runs[kind])["status"] == "failed", kind
        assert (failure["kind"], failure["rank"], failure["step"]) == (recorded, rank, step), (kind, failure)
    assert "train/loss is nan at step 4" in summary_of(runs["nan_loss"])["failure"]["message"]
    assert summary_of(runs["crash"])["failure"]["cause"] == "RuntimeError: injected crash at step 4 on rank 1"
    assert "train.micro_batch_size=8" in summary_of(runs["oom"])["failure"]["message"]
    assert summary_of(runs["sigkill"])["failure"]["message"].startswith("rank 1 ended abruptly")
    assert "rank 1 made no progress at step 4" in summary_of(runs["hang"])["failure"]["message"]
    # The sweep screen counts them.
    assert ": 7 runs =====" in run.output and "completed  1" in run.output, run.output[-3000:]
    assert "failed     6  (crash: 3, hang: 1, nan: 1, oom: 1)" in run.output, run.output[-3000:]
    rank_logs = "".join(p.read_text() for p in sweep_dir.glob(".submitit/*/*_log.out"))  # each rank logs there
    fault_to_summary(runs["hang"], injected_at(rank_logs, "hang"), "hang (local launcher)", MATRIX)
    for kind in ("nan_loss", "crash", "oom"):  # from the first rank's own record of it
        fault_at = min(r.time for r in read_rank_failures(runs[kind]) if r.failure.rank == r.reported_by)
        fault_to_summary(runs[kind], fault_at, f"{kind} (local launcher)", MATRIX)
    for kind in ("sigkill", "sigkill_in_checkpoint"):  # killed in step 4: from the last record, of step 3
        fault_to_summary(runs[kind], (runs[kind] / "metrics.jsonl").stat().st_mtime, f"{kind} (local launcher)", MATRIX)


def test_a_failed_run_keeps_its_logs_and_last_complete_checkpoint(matrix):
    _, runs, _ = matrix
    for kind in EXPECTED:
        steps = [json.loads(line)["step"] for line in (runs[kind] / "metrics.jsonl").read_text().splitlines()]
        assert steps[:3] == [1, 2, 3], kind
        assert (runs[kind] / "checkpoints" / "step_2" / "COMPLETE").exists(), kind
    # Killed inside the save of step 4: that checkpoint never counts.
    assert not (runs["sigkill_in_checkpoint"] / "checkpoints" / "step_4" / "COMPLETE").exists()


def test_no_rank_process_is_left(matrix):
    run, _, _ = matrix
    # The watch saw ranks (heartbeats) and the sweep's descendants (environment marker) while it ran;
    # a run's ranks may end between two 0.2 s polls, so not every rank's pid need have been seen.
    assert run.pids and len(run.marked) >= len(KINDS)
    assert run.alive() == []
