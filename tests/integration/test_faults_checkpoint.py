"""Broken checkpoints: one killed inside its save never counts, one broken after it was complete is
found at resume and skipped, and the run resumes from the one before, ending exactly where an
uninterrupted run ends."""

from __future__ import annotations

import json

import pytest
from support import run_cli

from dpo_sweeps.rundir.checkpoints import MARKER, CheckpointInfo, checkpoint_problem

RUN = ["data.num_train_pairs=256", "data.num_eval_pairs=32", "train.max_steps=8", "train.eval_every=4",
       "checkpoint.every_steps=2", "checkpoint.keep_last=2"]


def without_perf(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records]


def test_a_checkpoint_whose_file_is_missing_or_short_is_broken(tmp_path):
    path = tmp_path / "step_4"
    path.mkdir()
    (path / "__0_0.distcp").write_bytes(b"x" * 100)
    info = CheckpointInfo(4, path, {"files": {"__0_0.distcp": 100, "train_state_rank0.pt": 10}})
    assert checkpoint_problem(info) == "train_state_rank0.pt is missing"
    (path / "train_state_rank0.pt").write_bytes(b"y" * 10)
    assert checkpoint_problem(info) is None
    (path / "__0_0.distcp").write_bytes(b"x" * 40)
    assert checkpoint_problem(info) == "__0_0.distcp has 40 of its 100 bytes"


@pytest.mark.slow
def test_killed_in_a_save_then_a_broken_checkpoint_resumes_from_the_one_before(tmp_path):
    """Killed inside the save of step 6 (steps 2 and 4 complete), then step 4's shard truncated:
    the same command resumes from step 2 and ends with the uninterrupted run's metrics."""
    baseline = run_cli(tmp_path / "uninterrupted", *RUN)
    assert baseline.returncode == 0, baseline.stderr[-2000:]

    run_dir = tmp_path / "run"
    killed = run_cli(run_dir, *RUN, "faults.kind=sigkill_in_checkpoint", "faults.step=6")
    assert killed.returncode == -9, killed.stderr[-2000:]
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_2", "step_4", "step_6.tmp"]
    assert not (checkpoints / "step_6.tmp" / MARKER).exists()  # its files were written, it never counted
    shard = checkpoints / "step_4" / "__0_0.distcp"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size // 2])

    resumed = run_cli(run_dir, *RUN, "faults.kind=sigkill_in_checkpoint", "faults.step=6")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = resumed.summary
    assert summary["resumed_from_step"] == 2
    assert summary["broken_checkpoints"] == [f"step_4: __0_0.distcp has {size // 2} of its {size} bytes"]
    log = resumed.stdout + resumed.stderr
    assert [line for line in log.splitlines() if "is broken" in line][0].endswith("trying the one before")
    assert without_perf(resumed.records) == without_perf(baseline.records)
    final = {k: v for k, v in summary["metrics"].items() if not k.startswith("perf/")}
    assert final == {k: v for k, v in baseline.summary["metrics"].items() if not k.startswith("perf/")}
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
