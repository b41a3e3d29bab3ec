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
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import summary_json  # noqa: E402
from support.slurm import checkpoint_after, ensure_slurm_cluster, slurm, wait_for  # noqa: E402

from dpo_sweeps.rundir.checkpoints import latest_checkpoint  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS = 40
WAIT_S = 240  # the longest wait for one event of a sweep's jobs


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
        job_id = wait_for("the SLURM job", lambda: slurm("squeue", "-h", "-n", name, "-o", "%i", env=env),
                          proc, log, WAIT_S)

        # 1. The preemption signal: checkpoint, summary `preempted`, requeued by submitit.
        wait_for("a first checkpoint", lambda: checkpoint_after(run_dir, 0), proc, log, WAIT_S)
        slurm("scancel", "--signal=USR2", job_id, env=env)
        first = wait_for("the first attempt's summary", lambda: summary_json(run_dir), proc, log, WAIT_S)
        assert first["failure"]["kind"] == "preempted" and "SIGUSR2" in first["failure"]["message"]
        first_stop = first["metrics"]["steps"]
        assert latest_checkpoint(run_dir).step == first_stop < MAX_STEPS

        # 2. The requeued job resumed from that checkpoint; once it has saved one more, SLURM requeues it.
        second_ckpt = wait_for("a checkpoint of the second attempt", lambda: checkpoint_after(run_dir, first_stop),
                            proc, log, WAIT_S)
        slurm("scontrol", "requeue", job_id, env=env)

        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["scancel", "-n", name], env=env, timeout=30)

    summary = summary_json(run_dir)
    context = f"first stop {first_stop}, second checkpoint {second_ckpt}, summary {summary}"
    assert summary["status"] == "completed", context
    assert summary["metrics"]["steps"] == MAX_STEPS, context
    assert summary["resumed_from_step"] >= second_ckpt > first_stop, context
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == list(range(1, MAX_STEPS + 1))
    task0_logs = "".join(p.read_text() for p in sweep_dir.glob(".submitit/*/*_0_log.*"))
    # the job ran three times: first, after submitit's requeue, after scontrol's
    assert task0_logs.count("Starting with JobEnvironment") == 3, task0_logs[-3000:]
