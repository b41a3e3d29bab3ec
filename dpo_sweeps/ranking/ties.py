"""Which configs are tied with the best on preference accuracy, and ranks with ties.

Every pair of configs is compared: paired on the held-out pairs both scored when both have per-pair
records (McNemar's exact test with one seed each; with more, a t-test of per-pair seed means whose
variance adds the seed-level variance pooled over the configs with seeds: paired.py), else
unpaired from the accuracies and pair counts (score test, Newcombe's interval from Wilson's), else by
their means alone (no records, no pair count: nothing to test). Holm's adjustment runs over every
tested pair, not only those with the best, because the best is picked from the same data: comparing
the observed maximum with the rest on their own would claim too many differences.

- "Best": the highest mean accuracy. A config is tied with the best when the best is not
  significantly better than it (Holm-adjusted p >= alpha).
- rank_with_ties = 1 + the number of configs significantly better than it (Chatbot Arena's rule,
  with a test in place of interval overlap); a config whose every eval is NaN ranks last.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpo_sweeps.ranking import paired
from dpo_sweeps.ranking.eval_pairs import (
    EvalPairsUnreadable,
    PairRecords,
    config_records,
    read_final_eval,
    shared_rows,
)

# Past this many configs only the comparisons with the best are made (k(k-1)/2 tests grow fast);
# rank_with_ties then counts the best alone.
MAX_ALL_PAIRS = 200
BOOTSTRAP_RESAMPLES = 2000

PAIRED, UNPAIRED, MEANS = "paired", "unpaired", "means"


@dataclass
class ConfigEval:
    """What the comparison reads of one config."""

    label: str
    accuracy: float  # mean final accuracy over completed seeds; NaN when none is finite
    records: PairRecords | None = None  # every completed seed's per-pair records, lined up
    eval_pairs: int | None = None  # held-out pairs per run (summary.json), for the unpaired fallback
    seeds: int = 1
    nan_reason: str | None = None  # why the config has no accuracy though runs completed


@dataclass(frozen=True)
class SeedRun:
    """One completed training run of a config (one seed), as its summary.json has it."""

    run_dir: Path
    accuracy: float  # its final eval/rewards/accuracies; NaN when missing or NaN
    eval_pairs: int | None  # summary.json's data.eval_pairs; None when not written


def config_eval(label: str, runs: list[SeedRun],
                unreadable: Callable[[int, str], None] | None = None) -> ConfigEval:
    """What the comparison reads of a config from its seeds' runs: their per-pair records when every seed
    with an accuracy wrote them (the pairs all of them scored), else their pair counts.

    `unreadable(i, message)` hears of runs[i]'s eval_pairs.parquet that cannot be read; the config is then
    compared without records, as a run older than the file is.
    """
    scored = [(i, run) for i, run in enumerate(runs) if math.isfinite(run.accuracy)]
    if not scored:
        return ConfigEval(label, math.nan, nan_reason=f"every eval of its {len(runs)} completed run(s) is NaN")
    evals = []
    for i, run in scored:
        try:
            final = read_final_eval(run.run_dir)
        except EvalPairsUnreadable as problem:
            if unreadable is not None:
                unreadable(i, str(problem))
            final = None
        if final is None or not len(final):
            # One seed without records: pairing the others would leave its outcome out of the config's.
            evals = []
            break
        evals.append(final)
    counts = [run.eval_pairs for _, run in scored]
    eval_pairs = min(counts) if all(counts) else None
    accuracy = statistics.fmean(run.accuracy for _, run in scored)
    return ConfigEval(label, accuracy, config_records(evals), eval_pairs, len(scored))


@dataclass
class VersusBest:
    """One config against the best on accuracy (and on the continuous per-pair score)."""

    tied_with_best: bool
    rank_with_ties: int
    method: str | None  # paired, unpaired, means; None for the best itself and for unranked configs
    diff_vs_best: float = math.nan
    diff_vs_best_ci95_low: float = math.nan
    diff_vs_best_ci95_high: float = math.nan
    diff_vs_best_se: float = math.nan
    p_vs_best: float = math.nan
    p_vs_best_adjusted: float = math.nan
    compared_on_pairs: int | None = None
    score_name: str | None = None
    score_diff_vs_best: float = math.nan
    score_diff_vs_best_ci95_low: float = math.nan
    score_diff_vs_best_ci95_high: float = math.nan
    score_p_vs_best: float = math.nan
    # The config's own accuracy interval: a bootstrap over its pairs (a t interval over pairs and seeds with
    # several seeds), or Wilson's.
    accuracy_ci95: tuple[float, float] = (math.nan, math.nan)
    accuracy_interval: str | None = None
    note: str | None = None


@dataclass
class Resolution:
    """What the held-out set can tell apart (80% power, at the observed agreement between configs)."""

    method: str | None
    pairs: int | None  # the held-out pairs of the comparisons (their median)
    minimum_detectable_difference: float = math.nan
    alpha: float = paired.ALPHA  # per comparison: Holm's strictest step, alpha / tests
    tied: int = 0
    ranked: int = 0
    # When more than half the ranked configs are tied: the largest gap within the tied set, and the pairs
    # a paired test needs to resolve it.
    gap: float = math.nan
    gap_config: str | None = None
    pairs_to_resolve: int | None = None

    @property
    def mostly_tied(self) -> bool:
        return self.ranked > 1 and self.tied > self.ranked / 2


@dataclass
class QualityRanking:
    best: int | None  # index of the best config
    versus: list[VersusBest]  # aligned with the inputs
    tests: int  # the size of Holm's family
    resolution: Resolution
    # Comparisons made on fewer pairs than a side scored: (label a, label b, shared, most).
    partial_overlaps: list[tuple[str, str, int, int]] = field(default_factory=list)
    # Labels compared without per-pair records (unpaired or by means).
    unpaired: list[str] = field(default_factory=list)
    # better[i][j]: config i is significantly better than config j (by means where untested).
    better: np.ndarray | None = None
    tested: np.ndarray | None = None


@dataclass
class _Test:
    method: str
    p: float
    diff: float
    low: float = math.nan
    high: float = math.nan
    se: float = math.nan
    pairs: int | None = None
    sd: float = math.nan
    one_seed: bool = False  # paired, one seed each: the interval is the paired bootstrap's


def _test(a: ConfigEval, b: ConfigEval, seeds: paired.SeedVariance) -> _Test:
    """a against b on accuracy: the comparison their records allow; `diff` = a - b. `seeds`: the
    seed-level variance of accuracy, pooled over the sweep's configs with several seeds."""
    if a.records is not None and b.records is not None:
        rows_a, rows_b = shared_rows(a.records, b.records)
        if len(rows_a):
            ca, cb = a.records.correct[rows_a], b.records.correct[rows_b]
            difference = paired.paired_difference(ca, cb, seeds)
            # McNemar's exact test with one seed each and nothing known of seeds; else the t-test that adds them.
            exact = ca.shape[1] == 1 and cb.shape[1] == 1 and not seeds.variance
            p = paired.mcnemar_exact_p(ca[:, 0], cb[:, 0]) if exact else paired.t_p(ca, cb, seeds)
            low, high = (math.nan, math.nan) if exact else paired.t_interval(difference)
            return _Test(PAIRED, p, difference.mean, low, high, difference.se, len(rows_a), paired.null_sd(ca, cb),
                         exact)
    if a.eval_pairs and b.eval_pairs and math.isfinite(a.accuracy) and math.isfinite(b.accuracy):
        # Seeds pooled: every run scored its own eval_pairs pairs.
        n_a, n_b = a.eval_pairs * a.seeds, b.eval_pairs * b.seeds
        low, high, p = paired.unpaired_difference(a.accuracy, n_a, b.accuracy, n_b)
        return _Test(UNPAIRED, p, a.accuracy - b.accuracy, low, high)
    return _Test(MEANS, math.nan, a.accuracy - b.accuracy)


def _own_interval(config: ConfigEval, seeds: paired.SeedVariance, resamples: int,
                  seed: int) -> tuple[tuple[float, float], str | None]:
    if config.records is not None and (config.records.correct.shape[1] > 1 or seeds.variance):
        return paired.t_interval(paired.config_mean(config.records.correct, seeds)), "t over pairs and seeds"
    if config.records is not None and resamples > 0:
        return paired.bootstrap_interval(config.records.correct, None, resamples, seed), "bootstrap over pairs"
    if config.eval_pairs and math.isfinite(config.accuracy):
        return paired.wilson_interval(config.accuracy, config.eval_pairs * config.seeds), "Wilson"
    return (math.nan, math.nan), None


def compare_with_best(configs: list[ConfigEval], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                      alpha: float = paired.ALPHA) -> QualityRanking:
    """Test every pair of configs, adjust by Holm, and say for each config where it stands against the best.

    `resamples`: bootstrap resamples for the intervals (0 skips them: the tied decision and ranks use
    the tests alone, so the simulation in bench/ranking_power.py runs without them).
    """
    k = len(configs)
    ranked = [i for i, c in enumerate(configs) if math.isfinite(c.accuracy)]
    if not ranked:
        versus = [VersusBest(False, 1, None, note=c.nan_reason) for c in configs]
        return QualityRanking(None, versus, 0, Resolution(None, None))
    best = max(ranked, key=lambda i: configs[i].accuracy)
    seeds = paired.seed_variance([configs[i].records.correct for i in ranked if configs[i].records is not None])
    score_seeds = _score_seeds(configs, ranked, best) if configs[best].records is not None else None
    pairs = [(i, j) for x, i in enumerate(ranked) for j in ranked[x + 1:]]
    if len(ranked) > MAX_ALL_PAIRS:
        pairs = [(best, j) for j in ranked if j != best]
    tests = {(i, j): _test(configs[i], configs[j], seeds) for i, j in pairs}
    keys = list(tests)
    adjusted = dict(zip(keys, map(float, paired.holm([tests[key].p for key in keys], alpha))))
    better = np.zeros((k, k), dtype=bool)
    tested = np.zeros((k, k), dtype=bool)
    for (i, j), test in tests.items():
        if test.method == MEANS:  # nothing to test: the means decide, as before any records existed
            better[i, j], better[j, i] = test.diff > 0, test.diff < 0
            continue
        tested[i, j] = tested[j, i] = True
        if adjusted[(i, j)] < alpha:
            better[i, j], better[j, i] = test.diff > 0, test.diff < 0

    versus: list[VersusBest] = []
    last = len(ranked) + 1
    for index, config in enumerate(configs):
        if index not in ranked:
            versus.append(VersusBest(False, last, None, note=config.nan_reason))
            continue
        interval, interval_name = _own_interval(config, seeds, resamples, seed)
        result = VersusBest(not better[best, index], 1 + int(better[:, index].sum()), None,
                            accuracy_ci95=interval, accuracy_interval=interval_name)
        if index == best:
            result.diff_vs_best = 0.0
        else:
            key = (best, index) if (best, index) in tests else (index, best)
            test = tests[key]
            sign = 1.0 if key[0] == index else -1.0  # tests hold first - second; we want config - best
            result.method, result.p_vs_best, result.p_vs_best_adjusted = test.method, test.p, adjusted[key]
            # + 0.0: a config as good as the best differs by 0.0, not -0.0
            result.diff_vs_best, result.diff_vs_best_se = sign * test.diff + 0.0, test.se
            result.compared_on_pairs = test.pairs
            low, high = sorted((sign * test.low + 0.0, sign * test.high + 0.0))
            result.diff_vs_best_ci95_low, result.diff_vs_best_ci95_high = low, high
            if test.method == PAIRED:
                _paired_details(result, test, config, configs[best], score_seeds, resamples, seed)
        versus.append(result)

    outcome = QualityRanking(best, versus, sum(1 for t in tests.values() if t.method != MEANS),
                             _resolution(configs, ranked, best, tests, versus, alpha), better=better, tested=tested)
    for (i, j), test in tests.items():
        if test.method == PAIRED:
            most = max(configs[i].records.most_pairs, configs[j].records.most_pairs)
            if test.pairs < most:
                outcome.partial_overlaps.append((configs[i].label, configs[j].label, test.pairs, most))
    outcome.unpaired = [configs[i].label for i in ranked if configs[i].records is None]
    return outcome


def _score_seeds(configs: list[ConfigEval], ranked: list[int], best: int) -> paired.SeedVariance:
    """The seed-level variance of the continuous score, pooled over the configs scored as the best is."""
    name = configs[best].records.score_name
    return paired.seed_variance([configs[i].records.score for i in ranked
                                 if configs[i].records is not None and configs[i].records.score_name == name])


def _paired_details(result: VersusBest, test: _Test, config: ConfigEval, best: ConfigEval,
                    score_seeds: paired.SeedVariance, resamples: int, seed: int) -> None:
    """The interval of config - best on accuracy (the paired bootstrap with one seed each; else the test's
    t interval, already in `result`), and the same comparison on the continuous score."""
    rows, best_rows = shared_rows(config.records, best.records)
    if test.one_seed and resamples > 0:
        result.diff_vs_best_ci95_low, result.diff_vs_best_ci95_high = paired.bootstrap_interval(
            config.records.correct[rows], best.records.correct[best_rows], resamples, seed)
    if config.records.score_name != best.records.score_name:
        return  # a log-ratio margin against a policy margin: not one quantity
    a, b = config.records.score[rows], best.records.score[best_rows]
    result.score_name = config.records.score_name
    difference = paired.paired_difference(a, b, score_seeds)
    result.score_diff_vs_best = difference.mean
    result.score_p_vs_best = paired.t_p(a, b, score_seeds)
    if a.shape[1] > 1 or b.shape[1] > 1 or score_seeds.variance:
        result.score_diff_vs_best_ci95_low, result.score_diff_vs_best_ci95_high = paired.t_interval(difference)
    elif resamples > 0:
        result.score_diff_vs_best_ci95_low, result.score_diff_vs_best_ci95_high = paired.bootstrap_interval(
            a, b, resamples, seed)


def _resolution(configs: list[ConfigEval], ranked: list[int], best: int, tests: dict, versus: list[VersusBest],
                alpha: float) -> Resolution:
    with_best = [t for (i, j), t in tests.items() if best in (i, j) and t.method != MEANS]
    tied = sum(1 for i in ranked if versus[i].tied_with_best)
    if not with_best:
        return Resolution(MEANS if len(ranked) > 1 else None, None, tied=tied, ranked=len(ranked))
    family = max(1, sum(1 for t in tests.values() if t.method != MEANS))
    strictest = alpha / family
    paired_tests = [t for t in with_best if t.method == PAIRED]
    if paired_tests:
        n = int(np.median([t.pairs for t in paired_tests]))
        sd = float(np.median([t.sd for t in paired_tests]))
        resolution = Resolution(PAIRED, n, paired.minimum_detectable_difference(n, sd, strictest), strictest,
                                tied, len(ranked))
    else:
        n = int(configs[best].eval_pairs)
        resolution = Resolution(UNPAIRED, n, paired.unpaired_minimum_detectable_difference(
            n, configs[best].accuracy, strictest), strictest, tied, len(ranked))
    if resolution.mostly_tied:
        tied_others = [i for i in ranked if versus[i].tied_with_best and i != best]
        if tied_others:
            widest = min(tied_others, key=lambda i: versus[i].diff_vs_best)
            resolution.gap, resolution.gap_config = -versus[widest].diff_vs_best, configs[widest].label
            if paired_tests:
                resolution.pairs_to_resolve = paired.pairs_to_resolve(resolution.gap, sd, strictest)
            else:
                p = configs[best].accuracy
                resolution.pairs_to_resolve = paired.pairs_to_resolve(
                    resolution.gap, math.sqrt(2 * p * (1 - p)), strictest)
    return resolution
