"""A full disk: runs whose directory is a small tmpfs fill it during a checkpoint or the final model
save. Each fails with kind `disk_full` naming the path, still writes its summary.json, keeps what it
wrote before, and the sweep's other run completes. Needs root (it mounts the tmpfs itself)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import QUIET, REPO, cli_env
from support.faults import fault_to_summary
from support.mounts import tmpfs

pytestmark = pytest.mark.slow
TEST = "tests/integration/test_faults_disk.py::test_a_full_disk_is_recorded_and_the_sweep_goes_on"
TMPFS_SIZE = "512k"  # room for the run's logs and summary, not for a checkpoint or a model (~0.6 MB each)


@pytest.fixture
def sweep_dir(tmp_path):
    sweep = tmp_path / "sweep"
    with tmpfs(sweep / "0", TMPFS_SIZE), tmpfs(sweep / "1", TMPFS_SIZE):  # jobs 0 and 1 fill theirs; job 2 is on disk
        yield sweep


def test_a_full_disk_is_recorded_and_the_sweep_goes_on(sweep_dir):
    # Job 0 checkpoints every 2 steps (full at the first), job 1 only saves the model (full then), job 2 is on disk.
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *QUIET, "train.save_model=true", "data.num_train_pairs=256",
            "data.num_eval_pairs=32", "train.max_steps=4", "train.eval_every=0", "checkpoint.every_steps=2,0,3",
            "hydra.launcher.max_concurrent_jobs=1", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    summaries = {n: json.loads((sweep_dir / str(n) / "summary.json").read_text()) for n in range(3)}

    in_checkpoint, in_model_save, on_disk = summaries[0], summaries[1], summaries[2]
    assert in_checkpoint["failure"]["kind"] == "disk_full", output[-3000:]
    assert f"writing checkpoint {sweep_dir / '0' / 'checkpoints' / 'step_2.tmp'}" in in_checkpoint["failure"]["message"]
    assert in_model_save["failure"]["kind"] == "disk_full", output[-3000:]
    assert f"writing the final model to {sweep_dir / '1' / 'model'}" in in_model_save["failure"]["message"]
    assert on_disk["status"] == "completed"
    assert "failed     2  (disk_full: 2)" in output

    # What each wrote before the disk filled is intact (step 4: a train and an eval record).
    for n, steps in ((0, [1, 2]), (1, [1, 2, 3, 4, 4])):
        run_dir = sweep_dir / str(n)
        assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == steps
        assert (run_dir / ".hydra" / "config.yaml").exists()
        assert not (run_dir / "model").exists() and not list(run_dir.glob("checkpoints/*.tmp"))  # no half-written one
        # The disk filled just after the last metrics record was written.
        fault_to_summary(run_dir, (run_dir / "metrics.jsonl").stat().st_mtime,
                         f"disk_full ({'checkpoint' if n == 0 else 'model save'})", TEST)
