"""Injected faults (`faults.kind` at `faults.step` on `faults.rank`) in real sweeps: each failure is
recorded in its run's summary.json with its kind, no run hangs, and the sweep's other runs complete.

The kinds `timeout` and `preempted` come from stops, not faults: tests/test_checkpoint.py covers them
(train.time_limit_min, SIGTERM)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUIET = ["wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false"]
# Faults at step 3, a checkpoint every 2 steps: a failed run has one to keep.
SHORT = ["data.num_train_pairs=512", "data.num_eval_pairs=64", "train.max_steps=5", "train.eval_every=0",
         "checkpoint.every_steps=2", "faults.step=3"]


def run_sweep(sweep_dir: Path, *overrides: str, timeout: float) -> tuple[subprocess.CompletedProcess, float, dict]:
    """`python -m dpo_sweeps -m ...`; returns the process, its wall time and {faults.kind: run dir}."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dpo_sweeps", "-m", *QUIET, *SHORT, *overrides,
                           f"hydra.sweep.dir={sweep_dir}"], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - started
    runs = {}
    for summary_path in sweep_dir.glob("*/summary.json"):
        summary = json.loads(summary_path.read_text())
        runs[summary["config"]["faults"]["kind"]] = summary_path.parent
    return proc, elapsed, runs


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def logged_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_nan_and_oom_are_recorded_and_the_other_run_completes(tmp_path):
    proc, _, runs = run_sweep(tmp_path / "sweep", "faults.kind=null,nan_loss,oom", timeout=400)
    assert proc.returncode != 0  # the sweep says some runs failed
    assert set(runs) == {None, "nan_loss", "oom"}, proc.stderr[-3000:]

    healthy = summary_of(runs[None])
    assert healthy["status"] == "completed" and healthy["metrics"]["steps"] == 5

    nan = summary_of(runs["nan_loss"])
    assert nan["status"] == "failed" and nan["failure"]["kind"] == "nan"
    assert "train/loss is nan at step 3" in nan["failure"]["message"]
    assert logged_steps(runs["nan_loss"]) == [1, 2]  # stopped in the step the NaN appeared

    oom = summary_of(runs["oom"])
    assert oom["failure"]["kind"] == "oom"
    for setting in ("model=tiny-gpt2", "fsdp=full_shard", "precision=fp32", "train.batch_size=32",
                    "train.micro_batch_size=8"):
        assert setting in oom["failure"]["message"], setting

    for kind in ("nan_loss", "oom"):  # a failed run keeps its logs and checkpoints
        assert (runs[kind] / "checkpoints" / "step_2" / "COMPLETE").exists()
        assert logged_steps(runs[kind])[-1] == 2


def test_a_crashed_or_killed_rank_ends_its_run_quickly(tmp_path):
    """Rank 1 of 2 raises, or is SIGKILLed: rank 0 stops too, well before the collective timeout."""
    proc, elapsed, runs = run_sweep(tmp_path / "sweep", "faults.kind=crash,sigkill", "faults.rank=1",
                                    "resources.nproc_per_node=2", "resources.collective_timeout_s=120", timeout=400)
    assert proc.returncode != 0
    assert set(runs) == {"crash", "sigkill"}, proc.stderr[-3000:]
    crash = summary_of(runs["crash"])["failure"]
    assert crash["kind"] == "crash" and crash["message"] == "rank 1: RuntimeError: injected crash at step 3 on rank 1"
    killed = summary_of(runs["sigkill"])
    assert killed["failure"]["kind"] == "crash" and killed["metrics"]["steps"] == 2
    assert elapsed < 2 * 120  # both runs, start-up included, in less than two collective timeouts
    for run_dir in runs.values():
        assert (run_dir / "checkpoints" / "step_2" / "COMPLETE").exists()
