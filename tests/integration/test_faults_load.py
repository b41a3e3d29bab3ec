"""Load: a local sweep of 48 short one-rank jobs, two at a time. Every job ends with a summary, the
sweep screen and the report count 48, no rank process is left, and the same command again skips
all 48 without starting a job."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support import QUIET, REPO, cli_env
from support.faults import record_seconds, run_watched, summary_of

pytestmark = pytest.mark.slow
JOBS = 48


def test_48_jobs_two_at_a_time_then_a_rerun_skips_them_all(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *QUIET, "data.num_train_pairs=64", "data.num_eval_pairs=8",
            "train.batch_size=8", "train.max_steps=2", "train.eval_every=0", "checkpoint.every_steps=0",
            "perf.warmup_steps=0", "hydra.launcher.max_concurrent_jobs=2", f"train.seed=range(0,{JOBS})",
            f"hydra.sweep.dir={sweep_dir}"]
    run = run_watched(args, lambda: [p for p in sweep_dir.glob("[0-9]*") if p.is_dir()], timeout=1500)
    assert run.returncode == 0, run.output[-3000:]
    runs = sorted(p for p in sweep_dir.glob("[0-9]*") if p.is_dir())
    assert len(runs) == JOBS and all(summary_of(p)["status"] == "completed" for p in runs)
    assert f": {JOBS} runs =====" in run.output and f"completed  {JOBS}" in run.output and "failed     0" in run.output
    assert run.alive() == []

    report = subprocess.run([sys.executable, "analysis/report.py", str(sweep_dir)], cwd=REPO, env=cli_env(),
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert f"{JOBS} runs: {JOBS} completed" in report.stdout

    started = time.monotonic()
    again = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    assert again.returncode == 0, again.stderr[-3000:]
    output = again.stdout + again.stderr
    assert f"{JOBS} of {JOBS} runs already completed" in output and " started: " not in output
    record_seconds("rerun of 48 completed jobs (all skipped)", seconds,
                   "tests/integration/test_faults_load.py::test_48_jobs_two_at_a_time_then_a_rerun_skips_them_all")
