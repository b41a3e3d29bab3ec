"""The pretrained model's own preference on the held-out pairs, the baseline DPO has to beat.

Before the first step (train.zero_shot_eval), the policy scores each held-out pair with no reference:
it prefers the chosen response when log p(chosen | prompt) > log p(rejected | prompt), summed over
the response tokens as the loss sums them. `eval/zero_shot/accuracy` is the share of pairs it gets
right, `eval/zero_shot/margin` the mean log-prob difference. Two held-out accuracies are reported
beside it, each with the same 95% interval, so that they can be compared in summary.json:
- `eval/rewards/accuracies`, DPO's implicit reward: the policy against the reference. It starts at 0
  (every margin is 0), so it measures what training added, not what the model already knew;
- `eval/policy/accuracy` (and `eval/policy/margin`), the trained policy's own preference measured as the
  baseline is: the same quantity before and after training.
"""

from __future__ import annotations

import math

import torch

# Per-pair statistics of a zero-shot pass, from the per-pair statistics a held-out pass makes.
ZERO_SHOT_STATS = ("accuracy", "margin")
# z of a two-sided 95% interval.
Z95 = 1.959963984540054


def zero_shot_stats(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per pair: 1 when the policy alone gives the chosen response the higher log-prob, and the difference."""
    chosen, rejected = stats["logps/chosen"], stats["logps/rejected"]
    return {"accuracy": (chosen > rejected).float(), "margin": chosen - rejected}


def wilson_interval(accuracy: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion observed over n trials (Wilson 1927; Agresti & Coull 1998)."""
    if n <= 0:
        return 0.0, 1.0
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At 0 (or 1) the bound is exactly 0 (1); computed, it is off by a rounding error (1e-17) that would
    # put the interval beside the proportion instead of around it.
    low = 0.0 if accuracy <= 0 else max(0.0, centre - half)
    high = 1.0 if accuracy >= 1 else min(1.0, centre + half)
    return low, high


def interval_record(key: str, accuracy: float, n: int) -> dict[str, float]:
    """`<key>_ci95_low` and `<key>_ci95_high`: the 95% interval as two scalars, as every metric is."""
    low, high = wilson_interval(accuracy, n)
    return {f"{key}_ci95_low": low, f"{key}_ci95_high": high}


def zero_shot_record(means: dict[str, float], pairs: int) -> dict[str, float]:
    """metrics.jsonl / summary.json: eval/zero_shot/{accuracy, margin, accuracy_ci95_low, accuracy_ci95_high,
    pairs}."""
    record = {f"eval/zero_shot/{k}": means[k] for k in ZERO_SHOT_STATS}
    record.update(interval_record("eval/zero_shot/accuracy", means["accuracy"], pairs))
    record["eval/zero_shot/pairs"] = pairs
    return record


def zero_shot_from_reference(eval_pairs: list) -> dict[str, float] | None:
    """The record from the pairs' precomputed reference log-probs, which are the starting policy's own,
    scored alike (no second pass); None when some pair has none."""
    if not eval_pairs or any(p.reference_logps is None for p in eval_pairs):
        return None
    chosen, rejected = torch.tensor([p.reference_logps for p in eval_pairs], dtype=torch.float64).T
    stats = zero_shot_stats({"logps/chosen": chosen, "logps/rejected": rejected})
    return zero_shot_record({k: float(v.mean()) for k, v in stats.items()}, len(eval_pairs))


# The held-out accuracies compared with the baseline: DPO's implicit reward (policy against reference),
# and the trained policy's own preference, measured as the baseline is (Trainer.evaluate).
COMPARED_ACCURACIES = ("eval/rewards/accuracies", "eval/policy/accuracy")


def accuracy_interval(eval_metrics: dict, pairs: int) -> dict[str, float]:
    """The 95% interval of each held-out accuracy compared with the baseline: <key>_ci95_{low,high}."""
    record: dict[str, float] = {}
    for key in COMPARED_ACCURACIES:
        if eval_metrics.get(key) is not None:
            record.update(interval_record(key, eval_metrics[key], pairs))
    return record
