"""dpo_sweeps/ranking/paired.py: McNemar, Holm, the paired bootstrap, the seed-level variance and the tests that
add it, power; reference values computed here independently (scipy's binomial and t tests, Holm's rule by hand,
statsmodels' ANOVA table)."""

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


def _correlated(n: int, seeds: int, gap: float, shared: float, rng: np.random.Generator,
                seed_shift: float = 0.0) -> tuple[np.ndarray, ...]:
    """Two configs' (pairs, seeds) 0/1 outcomes, true accuracies about 0.7 and 0.7 - gap, correlated through a
    pair difficulty with standard deviation `shared` (the larger, the more the configs agree); `seed_shift`, the
    standard deviation of a trained seed's shift of every pair at once."""
    from scipy.stats import norm

    scale = math.sqrt(shared**2 + 1.0)
    difficulty = rng.normal(0, shared, size=(n, 1))

    def config(accuracy: float) -> np.ndarray:
        shift = rng.normal(0, seed_shift, size=(1, seeds))
        return (difficulty + shift + rng.normal(size=(n, seeds)) + norm.ppf(accuracy) * scale > 0).astype(float)

    return config(0.7), config(0.7 - gap)


def test_the_seed_variance_is_the_two_way_anova_moment_estimate_of_statsmodels_table():
    import pandas as pd
    from statsmodels.formula.api import ols
    from statsmodels.stats.anova import anova_lm

    rng = np.random.default_rng(3)
    n, seeds = 60, 4
    m = rng.normal(size=(n, 1)) + rng.normal(0, 0.5, size=(1, seeds)) + rng.normal(size=(n, seeds))
    frame = pd.DataFrame({"y": m.ravel(), "pair": np.repeat(np.arange(n), seeds), "seed": np.tile(np.arange(seeds), n)})
    table = anova_lm(ols("y ~ C(pair) + C(seed)", data=frame).fit())
    expected = (table.loc["C(seed)", "mean_sq"] - table.loc["Residual", "mean_sq"]) / n
    estimate = paired.seed_variance([m])
    assert estimate.variance == pytest.approx(expected, rel=1e-10) and estimate.df == seeds - 1
    # Pooled by the seeds' degrees of freedom; a one-seed matrix adds nothing; none with seeds: not estimated.
    other = rng.normal(size=(n, 2))
    other_alone = paired.seed_variance([other]).variance
    pooled = paired.seed_variance([m, other, rng.normal(size=(n, 1))])
    assert pooled.df == 4
    assert pooled.variance == pytest.approx(max(0.0, (3 * expected + other_alone) / 4), rel=1e-10)
    assert paired.seed_variance([rng.normal(size=(n, 1))]) == paired.NO_SEED_VARIANCE


def test_a_seed_that_moves_every_pair_is_counted_once_and_covers_the_truth():
    # Equal configs, 3 seeds each, every seed shifting all its pairs: the pairs-only test claims differences
    # that are seed luck; with the seed-level variance the interval covers 0 about 95% of the time.
    rng = np.random.default_rng(17)
    covered = pairs_only_covered = 0
    for _ in range(60):
        a, b = _correlated(1000, 3, 0.0, 1.0, rng, seed_shift=0.25)
        seeds = paired.seed_variance([a, b])
        low, high = paired.t_interval(paired.paired_difference(a, b, seeds))
        covered += low <= 0.0 <= high
        low, high = paired.t_interval(paired.paired_difference(a, b))
        pairs_only_covered += low <= 0.0 <= high
    # Below 51 of 60 would be a broken interval, not bad luck (p < 0.01); the pairs-only one falls far short.
    assert covered >= 51
    assert pairs_only_covered < covered - 10


def test_the_t_test_with_no_seed_variance_is_scipys_and_adding_it_only_widens():
    from scipy.stats import ttest_1samp

    a, b = _correlated(400, 2, 0.05, 1.0, np.random.default_rng(2))
    d = a.mean(axis=1) - b.mean(axis=1)
    assert paired.t_p(a, b) == pytest.approx(ttest_1samp(d, 0.0).pvalue, rel=1e-12)
    assert paired.t_p(a, b, paired.NO_SEED_VARIANCE) == paired.t_p(a, b)
    wider = paired.SeedVariance(0.0004, 2)
    assert paired.t_p(a, b, wider) > paired.t_p(a, b)
    plain, seeded = paired.paired_difference(a, b), paired.paired_difference(a, b, wider)
    assert seeded.se == pytest.approx(math.sqrt(plain.se**2 + 0.0004 * (1 / 2 + 1 / 2)))
    assert 2 < seeded.df < plain.df == 399  # Welch-Satterthwaite, between the two terms' own df
    low, high = paired.t_interval(seeded)
    assert low < seeded.mean < high and high - low > paired.t_interval(plain)[1] - paired.t_interval(plain)[0]


def test_the_paired_bootstrap_covers_the_true_difference_and_is_reproducible():
    rng = np.random.default_rng(7)
    covered = 0
    for trial in range(40):
        a, b = _correlated(300, 1, 0.05, 1.0, rng)
        low, high = paired.bootstrap_interval(a, b, 1000, seed=trial)
        covered += low <= 0.05 <= high
        assert low <= paired.paired_difference(a, b).mean <= high
    # 95% intervals: about 38 of 40; below 34 would be a broken interval, not bad luck (p < 0.01).
    assert covered >= 34
    a, b = _correlated(300, 1, 0.05, 1.0, np.random.default_rng(1))
    assert paired.bootstrap_interval(a, b, 500, seed=3) == paired.bootstrap_interval(a, b, 500, seed=3)


def test_the_paired_interval_shrinks_as_the_configs_agree_more():
    widths = []
    for shared in (0.2, 1.0, 3.0):
        a, b = _correlated(1000, 1, 0.03, shared, np.random.default_rng(11))
        low, high = paired.bootstrap_interval(a, b, 1000, seed=0)
        widths.append(high - low)
    assert widths[0] > widths[1] > widths[2]


def test_one_seed_uses_the_paired_bootstrap_of_the_differences():
    a, b = _outcomes(60, 14, 4, 22)
    low, high = paired.bootstrap_interval(a[:, None], b[:, None], 4000, seed=0)
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
