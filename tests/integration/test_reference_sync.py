"""TR-DPO's reference sync (train.reference_sync) on 2 real FSDP2 ranks: the reference moves toward the
policy in place, for a full fine-tune (the sharded reference model) and with adapters (a second, frozen
adapter), and checkpoints hold it, so resume stays exact."""

from __future__ import annotations

import math

import pytest
from support import run_cli

from dpo_sweeps.rundir.checkpoints import complete_checkpoints

LEAN = ["model=tiny_llama", "train.max_steps=3", "train.eval_every=0", "train.batch_size=8", "train.micro_batch_size=2",
        "train.warmup_steps=0", "train.lr=1e-2", "data.num_train_pairs=64", "data.num_eval_pairs=16",
        "perf.warmup_steps=1", "resources.nproc_per_node=2", "train.precompute_reference_logps=false"]


@pytest.mark.parametrize("overrides", [
    ["peft=lora", "peft.r=4"],
    pytest.param(["peft=none", "fsdp=shard_grad_op", "precision=bf16"], marks=pytest.mark.slow),
])
def test_a_reference_synced_fully_after_every_step_starts_every_step_at_ln2(tmp_path, overrides):
    """alpha=1 every step: the reference becomes the policy after each step, so each step starts at ln 2
    (without the sync, steps 2 and 3 move away from it: test_lora.py)."""
    synced = run_cli(tmp_path / "synced", *LEAN, *overrides, "train.reference_sync.every_steps=1",
                     "train.reference_sync.alpha=1")
    assert synced.returncode == 0, synced.stderr[-2000:]
    losses = synced.train_losses()
    assert len(losses) == 3 and all(abs(loss - math.log(2)) < 1e-6 for loss in losses), losses


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [["peft=lora", "peft.r=4"], ["peft=none"]])
def test_a_crashed_tr_dpo_run_resumes_exactly(tmp_path, overrides):
    """fp32, a sync every 2 steps at alpha 0.5, a crash at step 5 (checkpoint at 4): the same command ends
    with every logged value equal to an uninterrupted run's (the checkpoint holds the moved reference)."""
    run = [*LEAN, *overrides, "train.max_steps=6", "train.eval_every=3", "checkpoint.every_steps=2",
           "train.reference_sync.every_steps=2", "train.reference_sync.alpha=0.5", "train.save_model=false"]
    baseline = run_cli(tmp_path / "uninterrupted", *run)
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    faulted = [*run, "faults.kind=crash", "faults.step=5", "faults.rank=1"]
    assert run_cli(tmp_path / "run", *faulted).returncode == 1
    assert [c.step for c in complete_checkpoints(tmp_path / "run")][-1] == 4
    resumed = run_cli(tmp_path / "run", *faulted)
    assert resumed.returncode == 0 and resumed.summary["resumed_from_step"] == 4, resumed.stderr[-2000:]
    without_perf = lambda r: [{k: v for k, v in rec.items() if not k.startswith("perf/")} for rec in r.records]  # noqa: E731
    assert without_perf(resumed) == without_perf(baseline)
