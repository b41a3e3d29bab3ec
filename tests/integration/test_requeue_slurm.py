"""A 2-rank run on the local SLURM cluster, interrupted twice mid-run, resumes and completes.

First the preemption signal (what SLURM sends before a time limit or a preemption; here through
`scancel --signal=USR2`): the ranks checkpoint, and submitit's handler requeues the job through the
launcher's `checkpoint()`. Then `scontrol requeue`: SLURM sends SIGTERM and requeues the job itself.
Each requeued job reruns the same overrides in the same run directory and resumes from its latest
checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.slurm import ensure_slurm_cluster  # noqa: E402

from dpo_sweeps.train.checkpoint import latest_checkpoint  # noqa: E402

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 40


def _wait(what: str, condition, proc: subprocess.Popen, log: Path, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended while waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def _summary(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _checkpoint_after(run_dir: Path, step: int) -> int | None:
    latest = latest_checkpoint(run_dir)
    return latest.step if latest is not None and latest.step > step else None


def _slurm(*args: str, env: dict) -> str:
    return subprocess.run(args, env=env, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def test_requeued_job_resumes_from_its_checkpoint_and_completes(tmp_path):
    env = {**os.environ, **ensure_slurm_cluster()}
    name = f"dpo-requeue-{uuid.uuid4().hex[:8]}"
    sweep_dir, log = tmp_path / "sweep", tmp_path / "sweep.log"
    run_dir = sweep_dir / "0"
    command = [sys.executable, "-m", "dpo_sweeps", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=debug",
               f"hydra.launcher.name={name}", "hydra.launcher.timeout_min=30", "hydra.launcher.poll_interval_s=1",
               "wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false",
               "data.num_train_pairs=512", "data.num_eval_pairs=64", f"train.max_steps={MAX_STEPS}",
               "checkpoint.every_steps=5", "checkpoint.keep_when_completed=true", "resources.nproc_per_node=2",
               f"hydra.sweep.dir={sweep_dir}"]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        job_id = _wait("the SLURM job", lambda: _slurm("squeue", "-h", "-n", name, "-o", "%i", env=env), proc, log)

        # 1. The preemption signal: checkpoint, summary `preempted`, requeued by submitit.
        _wait("a first checkpoint", lambda: _checkpoint_after(run_dir, 0), proc, log)
        _slurm("scancel", "--signal=USR2", job_id, env=env)
        first = _wait("the first attempt's summary", lambda: _summary(run_dir), proc, log)
        assert first["failure"]["kind"] == "preempted" and "SIGUSR2" in first["failure"]["message"]
        first_stop = first["metrics"]["steps"]
        assert latest_checkpoint(run_dir).step == first_stop < MAX_STEPS

        # 2. The requeued job resumed from that checkpoint; once it has saved one more, SLURM requeues it.
        second_ckpt = _wait("a checkpoint of the second attempt", lambda: _checkpoint_after(run_dir, first_stop),
                            proc, log)
        _slurm("scontrol", "requeue", job_id, env=env)

        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["scancel", "-n", name], env=env, timeout=30)

    summary = _summary(run_dir)
    context = f"first stop {first_stop}, second checkpoint {second_ckpt}, summary {summary}"
    assert summary["status"] == "completed", context
    assert summary["metrics"]["steps"] == MAX_STEPS, context
    assert summary["resumed_from_step"] >= second_ckpt > first_stop, context
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == list(range(1, MAX_STEPS + 1))
    task0_logs = "".join(p.read_text() for p in sweep_dir.glob(".submitit/*/*_0_log.*"))
    # the job ran three times: first, after submitit's requeue, after scontrol's
    assert task0_logs.count("Starting with JobEnvironment") == 3, task0_logs[-3000:]
