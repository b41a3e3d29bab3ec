"""Sweeps on this machine: `python -m dpo_sweeps -m ...` with the grid sweeper and the local launcher."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.sweeps import COMPLETED_RUN_FORM, run_dir_form, run_sweep  # noqa: E402

from dpo_sweeps.launchers.placement import DevicePool  # noqa: E402
from dpo_sweeps.parallel.cpu_binding import rank_cores  # noqa: E402

# Four jobs, one of which fails: only the 2-rank job that reaches step 5 has the faulty rank 1.
# It checkpoints at step 4, so a second attempt resumes past the fault (faults hit first attempts only).
ONE_OF_FOUR_FAILS = ["train.max_steps=3,6", "resources.nproc_per_node=1,2", "faults.kind=crash", "faults.step=5",
                     "faults.rank=1", "checkpoint.every_steps=2"]


def test_invalid_points_are_all_refused_before_any_job_starts(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_sweep(sweep_dir, "fsdp=full_shard,hybrid_shard", "fsdp.hybrid_group_size=3",
                       "train.batch_size=30,32", "resources.nproc_per_node=2", "resources.nodes=1,2")
    assert result.returncode != 0
    assert "7 of 8 points of this sweep are invalid; no job was started" in result.stderr
    listed = {int(num): (overrides, reason)
              for num, overrides, reason in re.findall(r"^  #(\d+)  (.+)\n +(\S.+)$", result.stderr, flags=re.M)}
    # Points in grid order (fsdp, batch size, nodes); only #2 (full_shard, 32 pairs, one node) can run.
    assert sorted(listed) == [0, 1, 3, 4, 5, 6, 7]
    overrides, reason = listed[6]
    assert overrides == "fsdp=hybrid_shard train.batch_size=32 resources.nodes=1"  # what sets #6 apart
    assert reason == ("invalid_config: fsdp.hybrid_group_size: 3 does not divide the 2 ranks (accepted: a divisor "
                      "of resources.nodes * resources.nproc_per_node (null: the ranks of one node))")
    assert listed[0][1].startswith("invalid_config: train.batch_size: 30 is not a multiple of train.micro_batch_size")
    assert listed[3][1].startswith("invalid_config: resources.nodes: got 2; the local launcher runs a job on this "
                                   "machine only (accepted: 1; for several nodes use hydra/launcher=slurm)")
    assert "(every point also has: " in result.stderr and "fsdp.hybrid_group_size=3" in result.stderr
    assert not sweep_dir.exists()


def test_dry_run_lists_the_quickstart_jobs_and_launches_none(tmp_path):
    sweep_dir = tmp_path / "quickstart"
    result = run_sweep(sweep_dir, "+sweep=quickstart", "hydra.sweeper.dry_run=true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dry run: 8 of 8 jobs would be launched" in result.stdout
    jobs = re.findall(r"^  #(\d+)  (.+)   \[2 ranks -> (.+)\]$", result.stdout, flags=re.M)
    assert [int(n) for n, _, _ in jobs] == list(range(8))
    assert jobs[5][1] == "fsdp=shard_grad_op precision=fp32 loss.beta=0.5"
    assert len({label for _, label, _ in jobs}) == 8
    assert [Path(d) for _, _, d in jobs] == [sweep_dir / str(n) for n in range(8)]
    assert not sweep_dir.exists()


def test_a_dry_runs_printed_overrides_paste_back_as_the_same_sweep_with_values_that_need_quoting(tmp_path):
    sweep_dir = tmp_path / "sweep"
    given = ["wandb.mode=offline", "wandb.group=a b", "model.name_or_path=tiny*gpt|2", "loss.beta=0.1,0.2"]
    first = run_sweep(sweep_dir, *given, "hydra.sweeper.dry_run=true")
    assert first.returncode == 0, first.stderr[-3000:]
    shared = re.search(r"^every job: (.+)$", first.stdout, flags=re.M).group(1)
    words = shlex.split(shared)  # as a shell reads the pasted line
    # Hydra keeps a job's overrides in its own form (a space escaped, which it reads back as a space).
    assert "wandb.group=a\\ b" in words and "model.name_or_path=tiny*gpt|2" in words, shared
    labels = re.findall(r"^  #\d+  (.+?)   \[", first.stdout, flags=re.M)
    assert [shlex.split(label) for label in labels] == [["loss.beta=0.1"], ["loss.beta=0.2"]]
    again = run_sweep(sweep_dir, *words, "loss.beta=0.1,0.2", "hydra.sweeper.dry_run=true")
    assert again.returncode == 0 and again.stdout == first.stdout, again.stdout[-2000:]


@pytest.mark.slow
def test_a_failed_job_spares_the_others_and_a_rerun_runs_only_it(tmp_path):
    sweep_dir = tmp_path / "sweep"
    first = run_sweep(sweep_dir, *ONE_OF_FOUR_FAILS)
    assert first.returncode != 0, first.output[-3000:]
    statuses = {n: first.summary(n)["status"] for n in range(4)}
    assert statuses == {0: "completed", 1: "completed", 2: "completed", 3: "failed"}, first.output[-3000:]
    failure = first.summary(3)["failure"]
    assert failure["kind"] == "crash" and "injected crash at step 5 on rank 1" in failure["message"]
    assert [first.summary(n)["metrics"]["world_size"] for n in range(3)] == [1, 2, 1]
    for n in range(3):
        assert run_dir_form(sweep_dir / str(n)) == COMPLETED_RUN_FORM
    # The end-of-sweep screen: counts, where the results are, which run failed and why.
    screen = first.stdout[first.stdout.index("===== sweep"):]
    assert re.search(r"^completed  3$", screen, flags=re.M) and re.search(r"^failed     1  \(crash: 1\)$", screen, flags=re.M)
    assert f"dpo-sweeps-report {sweep_dir}" in screen  # the console script, as a wheel user has it
    assert re.search(r"#3  train.max_steps=6 resources.nproc_per_node=2\n +crash: rank 1: RuntimeError: injected crash",
                     screen)

    stamps = {n: (sweep_dir / str(n) / "summary.json").stat().st_mtime_ns for n in range(3)}
    second = run_sweep(sweep_dir, *ONE_OF_FOUR_FAILS)
    assert second.returncode == 0, second.output[-3000:]
    assert "3 of 4 runs already completed" in second.output
    assert re.findall(r"#(\d+) started", second.output) == ["3"]
    assert {n: (sweep_dir / str(n) / "summary.json").stat().st_mtime_ns for n in range(3)} == stamps
    assert second.summary(3)["status"] == "completed"
    assert second.summary(3)["config_hash"] == first.summary(3)["config_hash"]
    assert re.search(r"^completed  4  \(3 skipped: completed by an earlier invocation\)$", second.stdout, flags=re.M)

    # The grid grows by one value: the completed runs are found by config_hash, and the new points
    # get fresh run directories instead of the ones their grid numbers now point at.
    grown = [o if not o.startswith("train.max_steps=") else "train.max_steps=3,4,6" for o in ONE_OF_FOUR_FAILS]
    dry = run_sweep(sweep_dir, *grown, "hydra.sweeper.dry_run=true")
    assert dry.returncode == 0, dry.output[-3000:]
    assert "dry run: 2 of 6 jobs would be launched" in dry.stdout
    to_run = re.findall(r"^  #(\d+)  train.max_steps=4 resources.nproc_per_node=\d .* -> (.+)\]$", dry.stdout, flags=re.M)
    assert [(n, Path(d).name) for n, d in to_run] == [("6", "6"), ("7", "7")]


def test_each_rank_gets_its_own_block_of_the_cores():
    assert rank_cores([4, 5, 6, 7], 0, 2) == [4, 5] and rank_cores([7, 6, 5, 4], 1, 2) == [6, 7]
    assert rank_cores([0, 1, 2], 1, 2) == [1]  # equal blocks; a spare core stays unused
    assert rank_cores([0], 0, 2) is None  # fewer cores than ranks: no binding


def test_concurrent_gpu_jobs_get_disjoint_gpus_and_cores():
    """The local launcher's placement: a job never shares a GPU (or its cores) with a running job."""
    pool = DevicePool(cpus=list(range(8)), gpus=["0", "1", "2", "3"])
    first, second = pool.take(2, use_gpus=True), pool.take(2, use_gpus=True)
    assert (first.gpus, first.cpus) == (("0", "1"), (0, 1, 2, 3))
    assert (second.gpus, second.cpus) == (("2", "3"), (4, 5, 6, 7))
    assert pool.take(1, use_gpus=True) is None  # waits for a GPU to come free
    pool.give_back(first)
    assert pool.take(1, use_gpus=True).gpus == ("0",)
    assert "needs 8 GPUs" in pool.cannot_hold(8, use_gpus=True)


def test_cpu_jobs_run_side_by_side_on_their_own_cores():
    pool = DevicePool(cpus=[0, 1, 2, 3], gpus=[])
    a, b = pool.take(2, use_gpus=False), pool.take(2, use_gpus=False)
    assert set(a.cpus).isdisjoint(b.cpus) and pool.take(1, use_gpus=False) is None
    pool.give_back(a)
    pool.give_back(b)
    wide = pool.take(6, use_gpus=False)  # more ranks than cores: it runs alone, on all of them
    assert wide.cpus == (0, 1, 2, 3) and pool.take(1, use_gpus=False) is None
