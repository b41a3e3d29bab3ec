"""A sweep process killed mid-sweep leaves no run training on its own, and running the same command
again starts each run that had not completed once, resuming from its checkpoint."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
from support import REPO, cli_env
from support.sweeps import FAST, run_sweep

from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock

POINTS = ["train.seed=0,1,2", "train.max_steps=40", "checkpoint.every_steps=5", "hydra.launcher.max_concurrent_jobs=1"]


def _summary(run_dir) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _held(run_dir) -> bool:
    try:
        RunDirLock(run_dir).acquire().release()
    except RunDirInUse:
        return True
    return False


@pytest.mark.slow
def test_a_killed_sweep_reruns_only_what_had_not_completed_once(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *FAST, *POINTS, f"hydra.sweep.dir={sweep_dir}"]
    sweep = subprocess.Popen(args, cwd=REPO, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        # Kill it once #0 has completed and #1 is training (it has logged a step).
        while time.monotonic() < deadline and not (
                _summary(sweep_dir / "0").get("status") == "completed"
                and (sweep_dir / "1" / "metrics.jsonl").exists()
                and (sweep_dir / "1" / "metrics.jsonl").read_text().count("train/loss") >= 2):
            assert sweep.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.2)
        sweep.send_signal(signal.SIGKILL)
        sweep.wait()
    finally:
        if sweep.poll() is None:
            sweep.kill()
    first_attempt = _summary(sweep_dir / "0")["attempt"]
    # The killed sweep's run #1 stops by itself (it saves a checkpoint and records why).
    deadline = time.monotonic() + 60
    while _held(sweep_dir / "1") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _held(sweep_dir / "1"), "the killed sweep's run #1 is still training"
    assert _summary(sweep_dir / "1").get("status") != "completed"

    again = run_sweep(sweep_dir, *POINTS)
    assert again.returncode == 0, again.output[-3000:]
    assert "1 of 3 runs already completed" in again.output, again.output[-3000:]
    assert re.findall(r"#(\d+) started", again.output) == ["1", "2"], again.output[-3000:]
    assert _summary(sweep_dir / "0")["attempt"] == first_attempt  # the completed run was left as it was
    resumed = again.summary(1)
    assert resumed["status"] == "completed" and resumed.get("resumed_from_step"), resumed.get("resumed_from_step")
    assert again.summary(2)["status"] == "completed"
