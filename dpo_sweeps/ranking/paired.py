"""Paired statistics over per-pair eval outcomes: two configs scored on the same held-out pairs.

Pure functions over arrays. A config's outcomes are a (pairs, seeds) matrix: 0/1 for accuracy, a
float for a continuous score; row i of two configs' matrices is the same held-out pair. Comparing
per-pair differences is far tighter than comparing two independent intervals, because configs agree
on most pairs (Miller 2024, "Adding Error Bars to Evals", arXiv 2411.00640).

What a library computes comes from it: McNemar's exact test and Holm's adjustment from statsmodels,
the one-seed bootstrap from scipy, the power of a paired test from statsmodels' TTestPower. Only
the clustered bootstrap (pairs, then seeds within each pair) is written here, since no library has it.
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
class Difference:
    """Mean paired difference a - b over pairs, its standard error and the pairs it is over."""

    mean: float
    se: float
    n: int


def pair_means(outcomes: np.ndarray) -> np.ndarray:
    """Per pair, the mean over seeds: (pairs, seeds) -> (pairs,)."""
    return np.asarray(outcomes, dtype=np.float64).reshape(len(outcomes), -1).mean(axis=1)


def paired_difference(a: np.ndarray, b: np.ndarray) -> Difference:
    """mean(d) and sd(d)/sqrt(n), d the per-pair difference of the seed means (Miller 2024, eq. 7)."""
    d = pair_means(a) - pair_means(b)
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan
    return Difference(float(d.mean()), se, len(d))


def bootstrap_interval(matrices: list[np.ndarray], signs: list[float], resamples: int, seed: int,
                       confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A percentile interval of sum_j sign_j * mean(matrices[j]) by resampling pairs, and seeds within them.

    `matrices`: (pairs, seeds_j) outcomes with the same rows (pairs); seeds may differ in number. One
    seed each: the paired bootstrap of the per-pair differences, scipy.stats.bootstrap's. Several:
    a two-stage clustered bootstrap (Davison & Hinkley 1997, sec. 3.8): each resample draws pairs with
    replacement, the same draw for every config (that is the pairing), then each config's seeds with
    replacement within each drawn pair.
    """
    values = [np.asarray(m, dtype=np.float64).reshape(len(m), -1) for m in matrices]
    n = len(values[0])
    d = sum(s * pair_means(m) for s, m in zip(signs, values))
    if n == 0 or resamples <= 0:
        return math.nan, math.nan
    if np.all(d == d[0]):  # every pair the same: no spread to resample (scipy refuses degenerate data)
        return float(d[0]), float(d[0])
    rng = np.random.default_rng(seed)
    if all(m.shape[1] == 1 for m in values):
        from scipy.stats import bootstrap

        # Percentile, as the clustered branch below: BCa's jackknife costs n evaluations per interval.
        result = bootstrap((d,), np.mean, n_resamples=resamples, confidence_level=confidence,
                           method="percentile", random_state=rng, vectorized=True)
        low, high = result.confidence_interval
        return float(low), float(high)
    statistics = np.empty(resamples)
    # Chunks keep the (resamples, pairs, seeds) index arrays to a few MB.
    chunk = max(1, 2_000_000 // max(1, n * max(m.shape[1] for m in values)))
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        rows = rng.integers(0, n, size=(size, n))
        total = np.zeros(size)
        for sign, m in zip(signs, values):
            seeds = m.shape[1]
            if seeds == 1:
                drawn = m[rows, 0]
            else:
                columns = rng.integers(0, seeds, size=(size, n, seeds))
                drawn = m[rows[:, :, None], columns].mean(axis=2)
            total += sign * drawn.mean(axis=1)
        statistics[start:start + size] = total
    tail = (1 - confidence) / 2
    return float(np.quantile(statistics, tail)), float(np.quantile(statistics, 1 - tail))


def mcnemar_exact_p(a: np.ndarray, b: np.ndarray) -> float:
    """McNemar's exact test (statsmodels) of two configs' 0/1 outcomes on the same pairs."""
    from statsmodels.stats.contingency_tables import mcnemar

    a, b = np.asarray(a, dtype=bool).ravel(), np.asarray(b, dtype=bool).ravel()
    table = [[int(np.sum(a & b)), int(np.sum(a & ~b))], [int(np.sum(~a & b)), int(np.sum(~a & ~b))]]
    if table[0][1] + table[1][0] == 0:  # no discordant pair: nothing tells the configs apart
        return 1.0
    return float(mcnemar(table, exact=True).pvalue)


def paired_t_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided one-sample t-test (scipy) of the per-pair differences of seed means.

    Used for accuracy when a config has several seeds (a pair's seed mean is no longer 0/1, and
    pooling seeds into McNemar's table would count a pair several times) and for the continuous score.
    """
    from scipy.stats import ttest_1samp

    d = pair_means(a) - pair_means(b)
    if len(d) < 2:
        return math.nan
    if np.all(d == d[0]):  # no spread: the same on every pair, so equal (p 1) or apart on every pair (p 0)
        return 1.0 if d[0] == 0 else 0.0
    return float(ttest_1samp(d, 0.0).pvalue)


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
