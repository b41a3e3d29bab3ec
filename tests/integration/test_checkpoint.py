"""Checkpoints and resume, through the real CLI: a killed or stopped run, run again with the same
command (same hydra.run.dir), ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dpo_sweeps.rundir.checkpoints import MARKER, complete_checkpoints, latest_checkpoint
from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock
from dpo_sweeps.train.checkpoint import capture_rng_state, restore_rng_state

REPO = Path(__file__).resolve().parents[2]
QUIET = ["wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false"]
SMALL = ["data.num_train_pairs=512", "data.num_eval_pairs=64"]
# 2 ranks, 16 steps, evaluated at 8 and 16, a checkpoint every 5 steps. The learning rate decays from step
# 4 on, so each resumed attempt has to pick up the schedule where the checkpoint left it.
TWO_RANKS = [*SMALL, "resources.nproc_per_node=2", "train.max_steps=16", "train.eval_every=8",
             "checkpoint.every_steps=5", "checkpoint.keep_when_completed=true", "train.warmup_steps=4",
             "train.lr_schedule=linear"]


class RunResult:
    """What one `python -m dpo_sweeps` left: its exit code, stderr and run directory."""

    def __init__(self, returncode: int, stderr: str, run_dir: Path):
        self.returncode, self.stderr, self.run_dir = returncode, stderr, run_dir

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def records(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    def train_losses(self) -> list[float]:
        return [r["train/loss"] for r in self.records if "train/loss" in r]


def command(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "dpo_sweeps", *QUIET, *overrides, f"hydra.run.dir={run_dir}"]


def run_cli(run_dir: Path, *overrides: str) -> RunResult:
    proc = subprocess.run(command(run_dir, *overrides), cwd=REPO, capture_output=True, text=True, timeout=300)
    return RunResult(proc.returncode, proc.stderr, run_dir)


def _records_without_perf(result: RunResult) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in result.records]


def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it was signalled"
        if path.exists() and any(json.loads(line).get("step", 0) >= step for line in path.read_text().splitlines()):
            return
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached within {timeout} s")


@pytest.mark.slow
def test_killed_rank_then_same_command_resumes_with_identical_results(tmp_path):
    """SIGKILL of one rank at step 8 (checkpoint at 5), then a SIGTERM mid-run, then a clean finish:
    train/loss at every step and the final metrics equal an uninterrupted run's, bit for bit."""
    baseline = run_cli(tmp_path / "uninterrupted", *TWO_RANKS)
    assert baseline.returncode == 0, baseline.stderr[-2000:]

    run_dir = tmp_path / "run"
    overrides = [*TWO_RANKS, "faults.kind=sigkill", "faults.rank=1", "faults.step=8"]

    # Attempt 1: rank 1 is SIGKILLed during step 8; the checkpoint of step 5 survives.
    killed = run_cli(run_dir, *overrides)
    assert killed.returncode == 1
    assert killed.summary["status"] == "failed" and killed.summary["failure"]["kind"] == "crash"
    assert "SIGKILL" in killed.summary["failure"]["message"]
    assert [c.step for c in complete_checkpoints(run_dir)] == [5]
    # A checkpoint torn by a kill mid-save is never trusted, and the next attempt removes it.
    torn = run_dir / "checkpoints" / "step_7.tmp"
    torn.mkdir()
    (torn / ".metadata").write_bytes(b"half")

    # Attempt 2: the same command resumes at step 5 (no fault on a resumed attempt); SIGTERM after step 11.
    log_path = tmp_path / "attempt2.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command(run_dir, *overrides), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for_step(run_dir, 11, proc)
            assert not torn.exists()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 1, log_path.read_text()[-2000:]
    stopped = json.loads((run_dir / "summary.json").read_text())
    assert stopped["failure"]["kind"] == "preempted" and "SIGTERM" in stopped["failure"]["message"]
    assert stopped["resumed_from_step"] == 5
    stop_step = stopped["metrics"]["steps"]
    assert 11 <= stop_step < 16 and latest_checkpoint(run_dir).step == stop_step

    # Attempt 3: resumes where SIGTERM stopped it and completes.
    final = run_cli(run_dir, *overrides)
    assert final.returncode == 0, final.stderr[-2000:]
    assert final.summary["status"] == "completed" and final.summary["resumed_from_step"] == stop_step

    assert final.train_losses() == baseline.train_losses() and len(final.train_losses()) == 16
    assert _records_without_perf(final) == _records_without_perf(baseline)  # every logged value, each step once
    for key in ("eval/loss", "eval/rewards/accuracies", "eval/rewards/margins", "train/loss", "steps"):
        assert final.summary["metrics"][key] == baseline.summary["metrics"][key], key
    # perf/* describe only the last attempt's steps (16 - stop_step of them).
    assert final.summary["metrics"]["perf/timed_steps"] <= 16 - stop_step
    assert len(complete_checkpoints(run_dir)) == 2  # checkpoint.keep_last


def test_second_job_on_a_live_run_dir_is_refused_without_touching_it(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text('{"status": "running elsewhere"}')
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.69}\n')
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}

    lock = RunDirLock(run_dir).acquire()  # this test process is the live job
    try:
        result = run_cli(run_dir, *SMALL, "train.max_steps=2")
    finally:
        lock.release()
    assert result.returncode == 1
    assert f"is being written by pid {os.getpid()}" in result.stderr
    assert "hydra.run.dir" in result.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name in before} == before
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "rank_failures").exists()


def test_lock_is_exclusive_and_released_with_its_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from dpo_sweeps.rundir.lock import RunDirLock; "
                               f"RunDirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirInUse, match=f"pid {holder.pid}"):
            RunDirLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    RunDirLock(tmp_path).acquire().release()  # the killed holder's lock is free again


def test_changed_config_in_the_same_run_dir_is_refused(tmp_path):
    """A run stopped by its time limit keeps a checkpoint; another config may not resume from it.

    The limit is long past when the first step ends, and with the reference scored per step
    (precompute off) the end of step 1 is the run's first chance to stop: it stops there, with a
    checkpoint, on any machine and whatever any cache holds."""
    run_dir = tmp_path / "run"
    per_step_reference = [*SMALL, "train.max_steps=50", "train.precompute_reference_logps=false"]
    stopped = run_cli(run_dir, *per_step_reference, "train.time_limit_min=0.0001")
    assert stopped.summary["failure"]["kind"] == "timeout", stopped.stderr[-2000:]
    assert "train.time_limit_min" in stopped.summary["failure"]["message"]
    saved = latest_checkpoint(run_dir)
    assert saved is not None and saved.step == stopped.summary["metrics"]["steps"] == 1

    changed = run_cli(run_dir, *per_step_reference, "train.lr=1e-3")
    assert changed.returncode == 1
    failure = changed.summary["failure"]
    assert failure["kind"] == "invalid_config"
    assert "checkpoint.resume" in failure["message"] and "train.lr" in failure["message"]
    assert latest_checkpoint(run_dir) == saved


def test_only_checkpoints_with_their_marker_count(tmp_path):
    folder = tmp_path / "checkpoints"
    for name, marker in (("step_3", True), ("step_12", True), ("step_20", False), ("step_30.tmp", True)):
        (folder / name).mkdir(parents=True)
        if marker:
            (folder / name / MARKER).write_text(json.dumps({"step": name}))
    assert [c.step for c in complete_checkpoints(tmp_path)] == [3, 12]
    assert latest_checkpoint(tmp_path).path == folder / "step_12"


def test_rng_states_round_trip_through_a_weights_only_load(tmp_path):
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    torch.save(capture_rng_state(torch.device("cpu")), tmp_path / "rng.pt")
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(2), random.seed(2), np.random.seed(2)
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), torch.device("cpu"))
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(again[0], expected[0]) and again[1:] == expected[1:]
