"""Every sharding strategy x precision trains as real multi-rank FSDP2 (gloo, CPU processes)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch
from support import QUIET, REPO, cli_env, run_cli

# A short 2-rank run: 10 optimizer steps of 16 pairs, 4 per rank per micro-batch (2 accumulation steps).
SHORT = ["train.max_steps=10", "train.eval_every=0", "train.batch_size=16", "train.micro_batch_size=4",
         "train.warmup_steps=2", "data.num_train_pairs=512", "data.num_eval_pairs=32", "perf.warmup_steps=2"]
PERF_KEYS = ("perf/tokens_per_s", "perf/tokens_per_s_per_device", "perf/examples_per_s", "perf/peak_memory_gib",
             "perf/speed_per_memory", "perf/step_time_s")

pytestmark = pytest.mark.slow


def check_trained(result, world_size):
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["status"] == "completed"
    metrics = summary["metrics"]
    assert metrics["world_size"] == world_size and metrics["steps"] == 10
    for key in PERF_KEYS:
        assert metrics[key] is not None and metrics[key] > 0, key
    assert "perf/mfu" in metrics and metrics["perf/mfu"] is None  # MFU is a GPU figure
    assert metrics["perf/tokens_per_s_per_device"] == pytest.approx(metrics["perf/tokens_per_s"] / world_size)
    losses = result.train_losses()
    assert len(losses) == 10 and sum(losses[-3:]) / 3 < losses[0]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("strategy", ["full_shard", "shard_grad_op", "no_shard"])
def test_two_ranks_train_with_every_strategy_and_precision(tmp_path, strategy, precision):
    result = run_cli(tmp_path / "run", *SHORT, f"fsdp={strategy}", f"precision={precision}",
                     "resources.nproc_per_node=2")
    check_trained(result, 2)
    if precision == "fp16":
        assert "train/loss_scale" in result.records[0]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_hybrid_shard_on_four_ranks_in_two_groups(tmp_path, precision):
    result = run_cli(tmp_path / "run", *SHORT, "fsdp=hybrid_shard", "fsdp.hybrid_group_size=2",
                     f"precision={precision}", "resources.nproc_per_node=4", timeout=600)
    check_trained(result, 4)


def test_one_and_two_ranks_give_the_same_losses_in_fp32(tmp_path):
    one = run_cli(tmp_path / "one", *SHORT)
    assert one.returncode == 0, one.stderr[-2000:]
    reference = one.train_losses()
    cores = sorted(os.sched_getaffinity(0))
    # Binding the ranks to cores of their own (the default) or not changes speed, never the numbers.
    for strategy, bind in (("full_shard", True), ("shard_grad_op", False)):
        two = run_cli(tmp_path / strategy, *SHORT, f"fsdp={strategy}", "resources.nproc_per_node=2",
                      f"resources.bind_cores={bind}")
        assert two.returncode == 0, two.stderr[-2000:]
        bound = re.search(r"rank 0 bound to cores (\[[\d, ]+\]) of", two.stderr)
        if bind and len(cores) >= 2:
            assert bound and json.loads(bound.group(1)) == cores[:len(cores) // 2], two.stderr[-2000:]
        else:
            assert bound is None
        for a, b in zip(reference, two.train_losses(), strict=True):
            assert abs(a - b) <= 1e-4 * abs(a), (strategy, reference, two.train_losses())


def test_a_rank_that_raises_ends_every_rank_and_the_run_is_failed(tmp_path):
    start = time.monotonic()
    result = run_cli(tmp_path / "run", *SHORT, "resources.nproc_per_node=2", "faults.kind=crash",
                     "faults.step=3", "faults.rank=1", "resources.collective_timeout_s=60", timeout=240)
    elapsed = time.monotonic() - start
    assert result.returncode == 1
    failure = result.summary["failure"]
    assert failure["kind"] == "crash" and "rank 1: RuntimeError: injected crash at step 3 on rank 1" in failure["message"]
    assert result.summary["metrics"]["steps"] == 2  # two steps completed before the crash
    assert elapsed < 120


def test_a_rank_killed_by_sigkill_is_named_in_the_failure(tmp_path):
    result = run_cli(tmp_path / "run", *SHORT, "resources.nproc_per_node=2", "faults.kind=sigkill",
                     "faults.step=2", "faults.rank=1", timeout=240)
    assert result.returncode == 1
    assert result.summary["failure"] == {"kind": "crash", "message": "rank 1 killed by SIGKILL", "rank": 1, "step": 2,
                                         "cause": "rank 1 killed by SIGKILL"}


def test_saved_model_is_gathered_to_rank_zero_and_loads_with_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = run_cli(tmp_path / "run", *SHORT, "resources.nproc_per_node=2", "train.save_model=true", "model=tiny_llama")
    assert result.returncode == 0, result.stderr[-2000:]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "model")
    assert type(model).__name__ == "LlamaForCausalLM"
    ids = tokenizer("topic 1: abc\nanswer:", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert torch.isfinite(logits).all() and logits.shape[-1] == len(tokenizer)


def test_torchrun_starts_the_same_entry_point(tmp_path):
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    run_dir = tmp_path / "run"
    from dpo_sweeps.parallel.rank_env import free_port

    args = [torchrun, "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "dpo_sweeps", *QUIET, *SHORT,
            "fsdp=shard_grad_op", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from support import RunResult

    check_trained(RunResult(proc.returncode, proc.stdout, proc.stderr, run_dir), 2)


def test_a_wrong_block_name_lists_the_models_block_classes(tmp_path):
    result = run_cli(tmp_path / "run", *SHORT, "model=tiny_gpt_neox", "model.block_name=GPT2Block",
                     "resources.nproc_per_node=2")
    assert result.returncode == 1
    assert result.summary["failure"]["kind"] == "invalid_config"
    assert "model.block_name: GPTNeoXForCausalLM has no module of class 'GPT2Block' (accepted: GPTNeoXLayer)" in \
        result.summary["failure"]["message"]
