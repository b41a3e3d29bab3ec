"""train.zero_shot_eval: the starting policy's own preference on the held-out pairs, the same whether
it is read from the precomputed reference log-probs or scored by a pass of its own; and the trained
policy's, eval/policy/*, measured alike."""

from __future__ import annotations

import math

import pytest
from support import run_cli

TINY = ["train.max_steps=2", "train.eval_every=0", "data.num_train_pairs=64", "data.num_eval_pairs=24",
        "train.batch_size=8", "train.micro_batch_size=4", "train.zero_shot_eval=true",
        "train.lr=1e-12"]  # too small to move an fp32 weight: the trained policy is the starting one


@pytest.mark.slow  # multi-process runs; the fast lane keeps its budget
def test_the_zero_shot_baseline_is_the_same_from_precomputed_reference_logps_or_a_pass(tmp_path):
    found = {}
    for precompute in ("true", "false"):
        result = run_cli(tmp_path / precompute, *TINY, f"train.precompute_reference_logps={precompute}")
        assert result.returncode == 0, result.stderr[-2000:]
        first = result.records[0]
        assert first["step"] == 0 and first["eval/zero_shot/pairs"] == 24
        found[precompute] = first
        metrics = result.summary["metrics"]
        low, high = metrics["eval/zero_shot/accuracy_ci95_low"], metrics["eval/zero_shot/accuracy_ci95_high"]
        assert low < metrics["eval/zero_shot/accuracy"] < high
        assert metrics["eval/rewards/accuracies_ci95_low"] <= metrics["eval/rewards/accuracies"]
        # The trained policy's own preference is scored as the baseline is: unmoved weights, same answer.
        assert math.isclose(metrics["eval/policy/accuracy"], metrics["eval/zero_shot/accuracy"], abs_tol=1e-6)
        assert math.isclose(metrics["eval/policy/margin"], metrics["eval/zero_shot/margin"], rel_tol=1e-5, abs_tol=1e-5)
        assert math.isclose(metrics["eval/policy/margin"], metrics["eval/logps/chosen"] - metrics["eval/logps/rejected"],
                            rel_tol=1e-6, abs_tol=1e-6)
        assert metrics["eval/policy/accuracy_ci95_low"] < metrics["eval/policy/accuracy"] < metrics["eval/policy/accuracy_ci95_high"]
    assert math.isclose(found["true"]["eval/zero_shot/accuracy"], found["false"]["eval/zero_shot/accuracy"],
                        abs_tol=1e-6)  # the same pairs right (a float32 mean against a float64 one)
    assert math.isclose(found["true"]["eval/zero_shot/margin"], found["false"]["eval/zero_shot/margin"],
                        rel_tol=1e-5, abs_tol=1e-5)
