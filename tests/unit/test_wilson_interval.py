"""The Wilson 95% interval that summary.json gives each held-out accuracy (train/zero_shot.py)."""

from __future__ import annotations

import pytest

from dpo_sweeps.train.zero_shot import wilson_interval


def test_the_interval_matches_the_textbook_value_and_always_contains_the_proportion():
    assert wilson_interval(0.5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # 5 of 10
    for n in (1, 7, 24, 256):
        for k in range(n + 1):
            low, high = wilson_interval(k / n, n)
            assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)
    # None right, or all: the bound on that side is the proportion itself, not a rounding error beside it.
    assert wilson_interval(0.0, 24)[0] == 0.0 and wilson_interval(1.0, 24)[1] == 1.0
