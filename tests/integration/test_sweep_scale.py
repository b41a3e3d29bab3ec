"""A large grid is checked whole before launch: a refused one lists its first invalid points and
counts the rest; a dry run lists every point composed from a shared base."""

from __future__ import annotations

import re

from support.sweeps import run_sweep


def test_a_refused_grid_lists_its_first_20_bad_points_and_counts_the_rest(tmp_path):
    result = run_sweep(tmp_path / "sweep", "train.seed=range(0,30)", "train.batch_size=30", "fsdp=full_shard,no_shard",
                       "hydra.sweeper.dry_run=true")
    assert result.returncode != 0
    assert "60 of 60 points of this sweep are invalid; no job was started. Fix or leave out (the first 20):" in result.stderr
    listed = re.findall(r"^  #(\d+)  ", result.stderr, flags=re.M)
    assert listed == [str(n) for n in range(20)], result.stderr[-2000:]
    assert "train.batch_size: 30 is not a multiple of train.micro_batch_size (8)" in result.stderr
    assert "  ... and 40 more" in result.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_dry_run_of_many_points_lists_each_with_its_own_run_directory(tmp_path):
    result = run_sweep(tmp_path / "sweep", "train.seed=range(0,300)", "loss.beta=0.1,0.3", "resources.device_memory_gib=64",
                       "hydra.sweeper.dry_run=true")
    assert result.returncode == 0, result.output[-2000:]
    assert "dry run: 600 of 600 jobs would be launched" in result.stdout
    jobs = re.findall(r"^  #(\d+)  train.seed=(\d+) loss.beta=([\d.]+)   \[1 rank -> (.+)\]$", result.stdout, flags=re.M)
    assert len(jobs) == 600
    assert all(path.endswith(f"/sweep/{num}") for num, *_rest, path in jobs)
    assert jobs[1][1:3] == ("0", "0.3") and jobs[2][1:3] == ("1", "0.1")
