"""Paired statistics over per-pair eval outcomes: two configs scored on the same held-out pairs.

Pure functions over arrays. A config's outcomes are a (pairs, seeds) matrix: 0/1 for accuracy, a
float for a continuous score; row i of two configs' matrices is the same held-out pair. Comparing
per-pair differences is far tighter than comparing two independent intervals, because configs agree
on most pairs (Miller 2024, "Adding Error Bars to Evals", arXiv 2411.00640).

With several seeds a config's accuracy varies for two reasons: each pair flips between seeds (a pair's
own seed-to-seed noise, carried by the per-pair differences of seed means), and a seed moves every pair
at once (a better or worse trained model: the seed-level variance, shared by all pairs and so invisible
to a test over pairs). The tests and intervals with several seeds add the second to the first, the
seed-level part estimated by the balanced two-way ANOVA's moments (pairs x seeds, Searle, Casella &
McCulloch 1992, ch. 4), pooled over the configs that have seeds. A two-stage bootstrap that redraws a
pair's seeds counts the pair's own flips twice (once in the pair's mean, once in the redraw) and none of
the seed-level part, so it is not used.

What a library computes comes from it: McNemar's exact test and Holm's adjustment from statsmodels,
the one-seed bootstrap and the t distribution from scipy, the power of a paired test from statsmodels'
TTestPower. The ANOVA moments are a few lines here: statsmodels' MixedLM fits them by likelihood, too
slow for bench/ranking_power.py's thousands of simulated sweeps.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
ALPHA = 0.05
POWER = 0.8


@dataclass(frozen=True)
class SeedVariance:
    """The variance a training seed shares across every pair, pooled over configs, and its degrees of
    freedom (0: no config has two seeds, so it is not estimated and counts as 0)."""

    variance: float = 0.0
    df: int = 0


NO_SEED_VARIANCE = SeedVariance()


def seed_variance(matrices: list[np.ndarray]) -> SeedVariance:
    """The seed-level variance of (pairs, seeds) outcome matrices, pooled over those with two seeds or more.

    Per matrix, the balanced two-way ANOVA without replication: E[MS_seeds] = s2_residual + n * s2_seed,
    E[MS_residual] = s2_residual, so s2_seed = (MS_seeds - MS_residual) / n. Pooled by the seeds' degrees of
    freedom, then clamped at 0 (a negative estimate: the seeds differ no more than their pairs' own flips say).
    """
    total, df = 0.0, 0
    for m in matrices:
        m = np.asarray(m, dtype=np.float64).reshape(len(m), -1)
        n, seeds = m.shape
        if seeds < 2 or n < 2:
            continue
        seed_means, row_means = m.mean(axis=0), m.mean(axis=1)
        ms_seeds = n * float(seed_means.var(ddof=1))
        residual = m - row_means[:, None] - seed_means[None, :] + m.mean()
        ms_residual = float(np.sum(residual * residual)) / ((n - 1) * (seeds - 1))
        total += (seeds - 1) * (ms_seeds - ms_residual) / n
        df += seeds - 1
    return SeedVariance(max(0.0, total / df), df) if df else NO_SEED_VARIANCE


@dataclass(frozen=True)
class Difference:
    """Mean paired difference a - b over pairs, its standard error and the pairs it is over; `df`, the
    degrees of freedom of its t (Welch-Satterthwaite when a seed-level variance is added)."""

    mean: float
    se: float
    n: int
    df: float = math.nan


def pair_means(outcomes: np.ndarray) -> np.ndarray:
    """Per pair, the mean over seeds: (pairs, seeds) -> (pairs,)."""
    return np.asarray(outcomes, dtype=np.float64).reshape(len(outcomes), -1).mean(axis=1)


def _seeds(outcomes: np.ndarray) -> int:
    return int(np.asarray(outcomes).reshape(len(outcomes), -1).shape[1])


def paired_difference(a: np.ndarray, b: np.ndarray, seeds: SeedVariance = NO_SEED_VARIANCE) -> Difference:
    """mean(d) and its standard error, d the per-pair difference of the seed means (Miller 2024, eq. 7):
    sd(d)^2 / n, plus the seed-level variance of each side's mean of seeds, s2_seed * (1/seeds_a + 1/seeds_b)."""
    d = pair_means(a) - pair_means(b)
    n = len(d)
    if n < 2:
        return Difference(float(d.mean()) if n else math.nan, math.nan, n)
    pairs_term = float(d.var(ddof=1)) / n
    seed_term = seeds.variance * (1 / _seeds(a) + 1 / _seeds(b)) if seeds.df else 0.0
    se = math.sqrt(pairs_term + seed_term)
    return Difference(float(d.mean()), se, n, _satterthwaite(pairs_term, n - 1, seed_term, seeds.df))


def config_mean(outcomes: np.ndarray, seeds: SeedVariance = NO_SEED_VARIANCE) -> Difference:
    """One config's mean over pairs and seeds with its standard error (the same terms as paired_difference)."""
    means = pair_means(outcomes)
    n = len(means)
    if n < 2:
        return Difference(float(means.mean()) if n else math.nan, math.nan, n)
    pairs_term = float(means.var(ddof=1)) / n
    seed_term = seeds.variance / _seeds(outcomes) if seeds.df else 0.0
    return Difference(float(means.mean()), math.sqrt(pairs_term + seed_term), n,
                      _satterthwaite(pairs_term, n - 1, seed_term, seeds.df))


def _satterthwaite(first: float, first_df: float, second: float, second_df: float) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of two variance estimates."""
    if second <= 0 or not second_df:
        return float(first_df)
    return (first + second) ** 2 / (first**2 / first_df + second**2 / second_df)


def t_interval(difference: Difference, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """mean +- t(df) * se (scipy's t quantile): the interval of the test in `t_p`."""
    from scipy.stats import t

    if not (math.isfinite(difference.se) and math.isfinite(difference.df)):
        return math.nan, math.nan
    half = float(t.ppf(0.5 + confidence / 2, difference.df)) * difference.se
    return difference.mean - half, difference.mean + half


def bootstrap_interval(a: np.ndarray, b: np.ndarray | None, resamples: int, seed: int,
                       confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A percentile interval of mean(a - b) (or of mean(a) when b is None) by resampling pairs: one seed per
    config, scipy.stats.bootstrap's paired bootstrap of the per-pair differences."""
    from scipy.stats import bootstrap

    d = pair_means(a) - (pair_means(b) if b is not None else 0.0)
    if len(d) == 0 or resamples <= 0:
        return math.nan, math.nan
    if np.all(d == d[0]):  # every pair the same: no spread to resample (scipy refuses degenerate data)
        return float(d[0]), float(d[0])
    # Percentile: BCa's jackknife costs n evaluations per interval.
    result = bootstrap((d,), np.mean, n_resamples=resamples, confidence_level=confidence,
                       method="percentile", random_state=np.random.default_rng(seed), vectorized=True)
    low, high = result.confidence_interval
    return float(low), float(high)


def mcnemar_exact_p(a: np.ndarray, b: np.ndarray) -> float:
    """McNemar's exact test (statsmodels) of two configs' 0/1 outcomes on the same pairs."""
    from statsmodels.stats.contingency_tables import mcnemar

    a, b = np.asarray(a, dtype=bool).ravel(), np.asarray(b, dtype=bool).ravel()
    table = [[int(np.sum(a & b)), int(np.sum(a & ~b))], [int(np.sum(~a & b)), int(np.sum(~a & ~b))]]
    if table[0][1] + table[1][0] == 0:  # no discordant pair: nothing tells the configs apart
        return 1.0
    return float(mcnemar(table, exact=True).pvalue)


def t_p(a: np.ndarray, b: np.ndarray, seeds: SeedVariance = NO_SEED_VARIANCE) -> float:
    """Two-sided t-test of the mean per-pair difference of seed means, with the seed-level variance added
    (paired_difference's standard error and degrees of freedom; scipy's t). Without it, scipy's one-sample
    t-test of the differences.

    Used for accuracy when a config has several seeds (a pair's seed mean is no longer 0/1, and pooling
    seeds into McNemar's table would count a pair several times, and no seed-level variance) and for the
    continuous score.
    """
    from scipy.stats import t, ttest_1samp

    d = pair_means(a) - pair_means(b)
    if len(d) < 2:
        return math.nan
    if np.all(d == d[0]) and not seeds.variance:  # no spread: equal (p 1) or apart on every pair (p 0)
        return 1.0 if d[0] == 0 else 0.0
    difference = paired_difference(a, b, seeds)
    if difference.se == 0 or not seeds.variance:
        return float(ttest_1samp(d, 0.0).pvalue)
    return float(2 * t.sf(abs(difference.mean) / difference.se, difference.df))


def holm(pvalues: list[float] | np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Holm's step-down adjusted p-values (statsmodels multipletests); NaN stays NaN, outside the family."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, dtype=np.float64)
    adjusted = np.full(p.shape, np.nan)
    tested = np.isfinite(p)
    if tested.any():
        adjusted[tested] = multipletests(p[tested], alpha=alpha, method="holm")[1]
    return adjusted


def unpaired_difference(accuracy_a: float, n_a: int, accuracy_b: float, n_b: int,
                        confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """Two independent proportions (no per-pair records): the Newcombe interval of a - b, built from their
    Wilson intervals, and the score test's p (statsmodels); returns (low, high, p)."""
    from statsmodels.stats.proportion import confint_proportions_2indep, test_proportions_2indep

    count_a, count_b = round(accuracy_a * n_a), round(accuracy_b * n_b)
    low, high = confint_proportions_2indep(count_a, n_a, count_b, n_b, method="newcomb", alpha=1 - confidence)
    if count_a * n_b == count_b * n_a:
        return float(low), float(high), 1.0
    p = test_proportions_2indep(count_a, n_a, count_b, n_b, method="score").pvalue
    return float(low), float(high), float(p)


def wilson_interval(accuracy: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson interval of an accuracy over n pairs (statsmodels proportion_confint)."""
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(round(accuracy * n), n, alpha=1 - confidence, method="wilson")
    return float(low), float(high)


def null_sd(a: np.ndarray, b: np.ndarray) -> float:
    """The per-pair difference's standard deviation under no difference: sqrt(mean(d^2)).

    For 0/1 outcomes and one seed this is the square root of the discordance (the share of pairs the
    two configs rank differently), the variance McNemar's power approximation uses (Connor 1987).
    """
    d = pair_means(a) - pair_means(b)
    return float(math.sqrt(np.mean(d * d))) if len(d) else math.nan


@functools.lru_cache(maxsize=256)
def _detectable_effect(n: int, alpha: float, power: float) -> float:
    # Cached: TTestPower solves by root finding, and a report (or bench/ranking_power.py's thousands of
    # sweeps) asks again for the same n and alpha.
    from statsmodels.stats.power import TTestPower

    return float(TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided"))


def minimum_detectable_difference(n: int, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest mean paired difference a two-sided paired test detects with `power` over n pairs whose
    per-pair difference has standard deviation `sd` (statsmodels TTestPower, solved for the effect size)."""
    if n < 2 or not math.isfinite(sd) or sd <= 0:
        return math.nan
    return _detectable_effect(int(n), float(alpha), float(power)) * sd


def unpaired_minimum_detectable_difference(n: int, accuracy: float, alpha: float = ALPHA,
                                           power: float = POWER) -> float:
    """The same for two independent accuracies near `accuracy`, n pairs each (statsmodels NormalIndPower)."""
    from statsmodels.stats.power import NormalIndPower

    spread = math.sqrt(accuracy * (1 - accuracy)) if 0 < accuracy < 1 else math.nan
    if n < 2 or not math.isfinite(spread):
        return math.nan
    effect = NormalIndPower().solve_power(effect_size=None, nobs1=n, ratio=1.0, alpha=alpha, power=power)
    return float(effect) * spread


def pairs_to_resolve(gap: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """How many held-out pairs a two-sided paired test needs to detect `gap` with `power`, per-pair differences
    having standard deviation `sd` (statsmodels' normal sample size, closed form: no root finding)."""
    from statsmodels.stats.power import normal_sample_size_one_tail

    if not (math.isfinite(gap) and math.isfinite(sd)) or gap == 0 or sd <= 0:
        return None
    # Two-sided at alpha: one tail at alpha / 2 (the other tail's share of the power is negligible).
    return math.ceil(float(normal_sample_size_one_tail(abs(gap), power, alpha / 2, std_null=sd)))
