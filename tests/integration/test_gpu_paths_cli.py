"""The GPU paths of tests/unit/test_gpu_paths.py that need the real CLI: a bf16 Llama's first step (and the
warning where the CPU has no bf16 kernels),
and CPU offload under resources.device=auto on a node without a GPU."""

from __future__ import annotations

import math

import pytest
import torch


def test_bf16_llamas_step_zero_loss_is_ln_2(tmp_path):
    """Policy and reference compute the same numbers at step 0 (RoPE's inv_freq in fp32 in both)."""
    from support import run_cli

    result = run_cli(tmp_path / "run", "model=tiny_llama", "precision=bf16", "train.max_steps=1",
                     "train.eval_every=0", "train.eval_max_pairs=8", "data.num_train_pairs=64",
                     "data.num_eval_pairs=8", "train.batch_size=8", "train.micro_batch_size=4")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.train_losses()[0] == pytest.approx(math.log(2), rel=1e-7)
    # Where oneDNN has no bf16 kernels (they need AVX-512: read from /proc/cpuinfo, not from torch), the
    # run says bf16 is slow here.
    avx512 = {"avx512bw", "avx512vl", "avx512dq"} <= set(open("/proc/cpuinfo").read().split())
    warned = "precision=bf16: oneDNN has no bf16 kernels for this CPU" in result.stdout + result.stderr
    assert warned == (not avx512), result.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a node without a GPU")
def test_cpu_offload_under_auto_on_a_node_without_a_gpu_fails_at_setup_naming_the_setting(tmp_path):
    from support import run_cli

    result = run_cli(tmp_path / "run", "fsdp.cpu_offload=true", "resources.device=auto", "train.max_steps=1")
    assert result.returncode == 1
    failure = result.summary["failure"]
    assert failure["kind"] == "invalid_config" and failure["message"].startswith("fsdp.cpu_offload: true on a CPU")
