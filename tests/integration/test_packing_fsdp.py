"""Packed runs (train.packing) train on the numbers padded runs train on: real runs on HH pairs, on 1 and 2
FSDP2 ranks, their metrics.jsonl against a padded run's, fp32, to 1e-5; step 1 at ln 2. Compiled blocks
(train.compile) too, on the same comparison.

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


def assert_same_numbers(packed: RunResult, padded: RunResult, ln2_rel: float = 1e-6) -> None:
    pairs = list(zip(packed.records, padded.records, strict=True))
    assert packed.train_losses()[0] == pytest.approx(math.log(2), rel=ln2_rel)
    for got, want in pairs:
        assert got["step"] == want["step"]
        for key in COMPARED:
            if key in want:
                # A margin is beta x a difference of summed log-probs (each ~1e2, carrying ~1e-5 of fp32
                # rounding that a different grouping of the step's pairs moves): compared absolutely.
                tolerance = {"abs": 1e-5} if "rewards" in key else {"rel": 1e-5, "abs": 1e-6}
                assert got[key] == pytest.approx(want[key], **tolerance), (got["step"], key)
    metrics = packed.summary["metrics"]
    assert metrics["perf/attention"] == "sdpa_dense_mask"
    assert 0 <= metrics["perf/padding_fraction"] < 1


@pytest.fixture(scope="module")
def padded(tmp_path_factory) -> RunResult:
    """The padded run every prefix-shared packed run is compared with (one rank)."""
    return completed(run_cli(tmp_path_factory.mktemp("padded") / "run", *SHORT))


# Every sharding strategy: hybrid_shard on 4 ranks, 2 replicas of a 2-rank shard (the batch divides by 4).
@pytest.mark.parametrize(("ranks", "strategy"), [(1, "full_shard"), (2, "full_shard"), (2, "shard_grad_op"),
                                                 (2, "no_shard"), (4, "hybrid_shard")])
def test_packed_runs_equal_the_padded_run(tmp_path, padded, ranks, strategy):
    hybrid = ["fsdp.hybrid_group_size=2", "train.micro_batch_size=2"] if strategy == "hybrid_shard" else []
    packed = completed(run_cli(tmp_path / "run", *SHORT, *PACKED, f"fsdp={strategy}",
                               f"resources.nproc_per_node={ranks}", *hybrid, timeout=600))
    assert_same_numbers(packed, padded)
    assert packed.summary["metrics"]["world_size"] == ranks
    if strategy == "hybrid_shard":  # sharded in pairs of ranks, replicated across the two pairs
        assert "mesh {'replicate': 2, 'shard': 2}" in packed.stdout + packed.stderr
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


def test_a_packed_run_with_compiled_blocks_and_activation_checkpointing_equals_the_padded_run(tmp_path, padded):
    """train.compile=true on 2 FSDP2 ranks (inductor's C++ kernels), blocks checkpointed, rows packed: the
    numbers of the padded eager run, and the first step's compile in summary.json apart from the step time.
    Inductor reorders the blocks' fp32 sums, moving each result by a few ulps: far inside 1e-5 over 2 steps,
    far below what a wrong mask or a block left out would change."""
    compiled = completed(run_cli(tmp_path / "run", *SHORT, *PACKED, "train.compile=true", "resources.nproc_per_node=2",
                                 "fsdp=full_shard", "fsdp.activation_checkpointing=true", "perf.warmup_steps=0",
                                 timeout=600))
    # Step 1's policy is compiled and its reference (scored before training, eager) is not: their log-probs,
    # equal in exact arithmetic, differ by fp32 rounding, so the first loss is ln 2 to 1e-5, not 1e-6.
    assert_same_numbers(compiled, padded, ln2_rel=1e-5)
    metrics = compiled.summary["metrics"]
    # The first step paid the compile (a checkpointed block dynamo could not trace would have run eagerly and
    # compiled nothing) and is not timed, even with perf.warmup_steps=0; the timed step did not compile.
    assert metrics["perf/compile_s"] > 0
    assert metrics["perf/first_step_s"] == pytest.approx(metrics["perf/compile_s"] + metrics["perf/step_time_s"])
    assert metrics["perf/timed_steps"] == 1 and metrics["perf/step_time_s"] < metrics["perf/first_step_s"]
    assert padded.summary["metrics"]["perf/compile_s"] is None and padded.summary["metrics"]["perf/first_step_s"] > 0
