"""train.compile=true on 2-rank FSDP2 (gloo, CPU processes, inductor's C++ kernels), with activation
checkpointing and the default prefix-shared rows (a 4-D mask): the compiled blocks train as the eager ones
do, and the first step's compile is in summary.json apart from the step time.

The compiled run spends most of its time compiling (each rank builds the training graph in its first step
and the no-grad graph in the final evaluation); the model and the steps are the fewest that show it."""

import pytest
from support import run_cli

# 3 optimizer steps of 8 pairs, one micro-batch of 4 per rank; the first step timed apart from the others.
SHORT = ["train.max_steps=3", "train.eval_every=0", "train.batch_size=8", "train.micro_batch_size=4",
         "train.warmup_steps=2", "data.num_train_pairs=64", "data.num_eval_pairs=8", "perf.warmup_steps=1",
         "resources.nproc_per_node=2", "fsdp.activation_checkpointing=true"]

pytestmark = pytest.mark.slow


def test_compiled_blocks_train_as_the_eager_ones_on_two_ranks(tmp_path):
    eager = run_cli(tmp_path / "eager", *SHORT)
    assert eager.returncode == 0, eager.stderr[-3000:]
    compiled = run_cli(tmp_path / "compiled", *SHORT, "train.compile=true", timeout=600)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    # Inductor fuses the blocks' ops into its own kernels and reorders their fp32 sums (layer norm, softmax,
    # the products' accumulation): each result moves by a few ulps (~1e-7 relative), and Adam carries that
    # into the weights, so the losses drift apart slowly; 1e-5 is far above that over 3 steps and far below
    # what a wrong mask or a block left out would change (the loss moves by > 1e-3 within a step).
    assert compiled.train_losses() == pytest.approx(eager.train_losses(), rel=1e-5)
    metrics = compiled.summary["metrics"]
    assert metrics["eval/loss"] == pytest.approx(eager.summary["metrics"]["eval/loss"], rel=1e-5)
    # The first step paid the compile (a checkpointed block dynamo could not trace would have run eagerly
    # and compiled nothing); the median timed step (steps 2 and 3) did not.
    assert metrics["perf/compile_s"] > 0
    assert metrics["perf/first_step_s"] == pytest.approx(metrics["perf/compile_s"] + metrics["perf/step_time_s"])
    assert metrics["perf/timed_steps"] == 2 and metrics["perf/step_time_s"] < metrics["perf/first_step_s"]
    assert eager.summary["metrics"]["perf/compile_s"] is None and eager.summary["metrics"]["perf/first_step_s"] > 0
