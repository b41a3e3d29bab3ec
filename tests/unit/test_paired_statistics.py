"""dpo_sweeps/ranking/paired.py: McNemar, Holm, the paired and clustered bootstrap, power; reference values computed
here independently (scipy's binomial test, Holm's rule by hand, statsmodels)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from dpo_sweeps.ranking import paired


def _outcomes(both: int, a_only: int, b_only: int, neither: int) -> tuple[np.ndarray, np.ndarray]:
    """Two configs' 0/1 outcomes on the same pairs, from the cells of McNemar's table."""
    a = np.array([1] * both + [1] * a_only + [0] * b_only + [0] * neither)
    b = np.array([1] * both + [0] * a_only + [1] * b_only + [0] * neither)
    return a, b


def test_mcnemar_exact_p_is_the_two_sided_binomial_test_of_the_discordant_pairs():
    # 60 pairs both right, 14 only a, 4 only b, 22 neither: the test looks at 4 of 18 discordant pairs.
    a, b = _outcomes(60, 14, 4, 22)
    expected = binomtest(4, 18, 0.5).pvalue
    assert paired.mcnemar_exact_p(a, b) == pytest.approx(expected, rel=1e-12)
    assert paired.mcnemar_exact_p(a, b) == pytest.approx(0.03088, abs=1e-5)
    assert paired.mcnemar_exact_p(b, a) == pytest.approx(expected, rel=1e-12)  # symmetric
    # No discordant pair: nothing tells the two apart.
    assert paired.mcnemar_exact_p(a, a) == 1.0


def test_paired_difference_and_its_standard_error_are_those_of_the_per_pair_differences():
    a, b = _outcomes(60, 14, 4, 22)
    difference = paired.paired_difference(a[:, None], b[:, None])
    d = a - b
    assert difference.mean == pytest.approx(10 / 100)
    assert difference.se == pytest.approx(np.std(d, ddof=1) / math.sqrt(100))
    assert difference.n == 100


def test_holm_matches_the_step_down_rule_by_hand_and_statsmodels_and_keeps_nan_outside_the_family():
    p = [0.01, 0.04, 0.03, 0.005]
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running max 0.06 for the last.
    assert paired.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert paired.holm(p) == pytest.approx(multipletests(p, method="holm")[1])
    with_untested = paired.holm([0.01, math.nan, 0.04])
    assert math.isnan(with_untested[1])
    assert with_untested[[0, 2]] == pytest.approx([0.02, 0.04])


def _correlated(n: int, seeds: int, gap: float, shared: float, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Two configs' (pairs, seeds) 0/1 outcomes, true accuracies 0.7 and 0.7 - gap, correlated through a pair
    difficulty with standard deviation `shared` (the larger, the more the configs agree)."""
    from scipy.stats import norm

    scale = math.sqrt(shared**2 + 1.0)
    difficulty = rng.normal(0, shared, size=(n, 1))
    a = (difficulty + rng.normal(size=(n, seeds)) + norm.ppf(0.7) * scale > 0).astype(float)
    b = (difficulty + rng.normal(size=(n, seeds)) + norm.ppf(0.7 - gap) * scale > 0).astype(float)
    return a, b


def test_the_clustered_bootstrap_covers_the_true_difference_and_is_reproducible():
    rng = np.random.default_rng(7)
    covered = 0
    for trial in range(40):
        a, b = _correlated(300, 2, 0.05, 1.0, rng)
        low, high = paired.bootstrap_interval([a, b], [1.0, -1.0], 1000, seed=trial)
        covered += low <= 0.05 <= high
        assert low <= paired.paired_difference(a, b).mean <= high
    # 95% intervals: about 38 of 40; below 34 would be a broken interval, not bad luck (p < 0.01).
    assert covered >= 34
    a, b = _correlated(300, 3, 0.05, 1.0, np.random.default_rng(1))
    assert paired.bootstrap_interval([a, b], [1.0, -1.0], 500, seed=3) == paired.bootstrap_interval(
        [a, b], [1.0, -1.0], 500, seed=3)


def test_the_paired_interval_shrinks_as_the_configs_agree_more():
    widths = []
    for shared in (0.2, 1.0, 3.0):
        a, b = _correlated(1000, 2, 0.03, shared, np.random.default_rng(11))
        low, high = paired.bootstrap_interval([a, b], [1.0, -1.0], 1000, seed=0)
        widths.append(high - low)
    assert widths[0] > widths[1] > widths[2]


def test_the_clustered_interval_of_seed_means_is_wider_than_treating_every_seed_as_a_pair():
    # Three seeds of a pair are not three pairs: the clustered bootstrap must not shrink as if they were.
    a, b = _correlated(400, 3, 0.0, 1.5, np.random.default_rng(5))
    low, high = paired.bootstrap_interval([a, b], [1.0, -1.0], 2000, seed=0)
    flat_a, flat_b = a.reshape(-1, 1), b.reshape(-1, 1)
    flat_low, flat_high = paired.bootstrap_interval([flat_a, flat_b], [1.0, -1.0], 2000, seed=0)
    assert high - low > flat_high - flat_low


def test_one_seed_uses_the_paired_bootstrap_of_the_differences():
    a, b = _outcomes(60, 14, 4, 22)
    low, high = paired.bootstrap_interval([a[:, None], b[:, None]], [1.0, -1.0], 4000, seed=0)
    # About the normal interval 0.10 +- 1.96 * se.
    se = paired.paired_difference(a[:, None], b[:, None]).se
    assert low == pytest.approx(0.10 - 1.96 * se, abs=0.02) and high == pytest.approx(0.10 + 1.96 * se, abs=0.02)


def test_wilson_is_statsmodels_wilson_interval():
    assert paired.wilson_interval(0.75, 256) == pytest.approx(proportion_confint(192, 256, method="wilson"))


def test_the_detectable_difference_falls_with_more_pairs_and_more_agreement():
    assert paired.minimum_detectable_difference(1000, 0.5) < paired.minimum_detectable_difference(256, 0.5)
    assert paired.minimum_detectable_difference(1000, 0.3) < paired.minimum_detectable_difference(1000, 0.5)
    # The textbook normal approximation: (z_0.975 + z_0.8) * sd / sqrt(n) = 2.80 * sd / sqrt(n).
    assert paired.minimum_detectable_difference(2000, 0.5) == pytest.approx(2.80 * 0.5 / math.sqrt(2000), rel=0.01)
    # ... and the pairs that would resolve a gap detect it at that size.
    n = paired.pairs_to_resolve(0.03, 0.5)
    assert paired.minimum_detectable_difference(n, 0.5) == pytest.approx(0.03, rel=0.01)
