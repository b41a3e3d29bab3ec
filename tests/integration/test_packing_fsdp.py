"""Packed runs (train.packing) train on the numbers padded runs train on: real runs on HH pairs, on 1 and 2
FSDP2 ranks, their metrics.jsonl against a padded run's, fp32, to 1e-5; step 1 at ln 2.

Two short steps suffice: step 1 compares the forward (policy and reference log-probs, the loss), step 2
the first update, so the gradient. The rows' budget holds two pairs, so the rows really are packed.
"""

from __future__ import annotations

import math

import pytest
from support import HH_PATH, RunResult, run_cli

pytestmark = pytest.mark.slow

SHORT = ["data=hh", f"data.path={HH_PATH}", "data.max_pairs=40", "data.eval_size=8", "data.max_length=128",
         "data.max_prompt_length=64", "train.batch_size=8", "train.micro_batch_size=4", "train.max_steps=2",
         "train.eval_every=0", "precision=fp32"]
PACKED = ["train.packing=true", "train.micro_batch_tokens=400"]
COMPARED = ("train/loss", "train/logps/chosen", "train/logps/rejected", "train/rewards/margins", "eval/loss",
            "eval/logps/chosen", "eval/logps/rejected")


def completed(result: RunResult) -> RunResult:
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def assert_same_numbers(packed: RunResult, padded: RunResult) -> None:
    pairs = list(zip(packed.records, padded.records, strict=True))
    assert packed.train_losses()[0] == pytest.approx(math.log(2), rel=1e-6)
    for got, want in pairs:
        assert got["step"] == want["step"]
        for key in COMPARED:
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), (got["step"], key)
    metrics = packed.summary["metrics"]
    assert metrics["perf/attention"] == "sdpa_dense_mask"
    assert 0 <= metrics["perf/padding_fraction"] < 1


@pytest.fixture(scope="module")
def padded(tmp_path_factory) -> RunResult:
    """The padded run every prefix-shared packed run is compared with (one rank)."""
    return completed(run_cli(tmp_path_factory.mktemp("padded") / "run", *SHORT))


@pytest.mark.parametrize(("ranks", "strategy"), [(1, "full_shard"), (2, "full_shard"), (2, "shard_grad_op")])
def test_packed_runs_equal_the_padded_run(tmp_path, padded, ranks, strategy):
    packed = completed(run_cli(tmp_path / "run", *SHORT, *PACKED, f"fsdp={strategy}",
                               f"resources.nproc_per_node={ranks}"))
    assert_same_numbers(packed, padded)
    assert packed.summary["metrics"]["world_size"] == ranks
    if ranks == 1:  # the same batch layout: only the cache key's packing tells the entries apart
        assert "reference log-probs: computed" in packed.stdout + packed.stderr


def test_packed_lora_run_with_unshared_prompts_and_a_per_step_reference_equals_its_padded_run(tmp_path):
    # The reference is the policy with its adapters off, scored in every step on the same packed rows.
    lora = [*SHORT, "peft=lora", "model=tiny_llama", "train.share_prompt=false",
            "train.precompute_reference_logps=false", "resources.nproc_per_node=2"]
    padded = completed(run_cli(tmp_path / "padded", *lora))
    packed = completed(run_cli(tmp_path / "packed", *lora, "train.packing=true", "train.micro_batch_tokens=256"))
    assert_same_numbers(packed, padded)
    assert padded.summary["metrics"]["perf/attention"] == "sdpa_padding_mask"
    assert padded.summary["metrics"]["perf/padding_fraction"] > 0
