"""Aggregate runs into configs (seeds as mean ± std), rank them, find their Pareto front.

A config is a set of runs that differ only by seed (`Run.config_key`). Its numbers are
the mean, the sample standard deviation and the count over its completed runs; failed
runs stay with their config as results of their own (an OOM says the config does not fit).
Both criteria, speed per memory and final preference accuracy, are better when higher.

Accuracy is compared with ties (dpo_sweeps/ranking/ties.py): on the held-out pairs configs share where runs
wrote per-pair records, and the Pareto front drops a config only where another is significantly
better on accuracy and no slower per GiB.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dpo_sweeps.analysis.runs import (
    FINISHED_STATUSES,
    PREFERENCE_ACCURACY,
    SEED_KEYS,
    SPEED_PER_MEMORY,
    SUMMARY_METRICS,
    Run,
    count_probes,
    report_metrics,
)
from dpo_sweeps.ranking.ties import ConfigEval, QualityRanking, SeedRun, VersusBest, compare_with_best
from dpo_sweeps.ranking.ties import config_eval as seeds_eval

CRITERIA = (SPEED_PER_MEMORY, PREFERENCE_ACCURACY)


@dataclass(frozen=True)
class Stat:
    """Mean, sample standard deviation (NaN for one value) and count of a metric's values."""

    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Stat | None:
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            return None
        std = statistics.stdev(finite) if len(finite) > 1 else math.nan
        return cls(statistics.fmean(finite), std, len(finite))


@dataclass
class ConfigResult:
    """The runs of one config, their aggregate metrics and where the config ranks."""

    key: tuple
    runs: list[Run]
    # The overrides that set this config apart from the others in the report.
    label: str = ""
    stats: dict[str, Stat] = field(default_factory=dict)
    # Metric -> 1-based rank (equal means share a rank); absent where the config has no value.
    ranks: dict[str, int] = field(default_factory=dict)
    pareto: bool = False
    # Against the best on accuracy (tied_with_best, rank_with_ties, ...); None without any accuracy to rank.
    versus_best: VersusBest | None = None

    @property
    def overrides(self) -> tuple[str, ...]:
        return self.runs[0].config_overrides

    @cached_property
    def settings(self) -> dict[str, Any]:
        """Override key -> value, seed left out: {"fsdp": "full_shard", "loss.beta": 0.1}."""
        return {k: v for k, v in self.runs[0].settings.items() if k not in SEED_KEYS}

    @property
    def completed(self) -> list[Run]:
        return [r for r in self.runs if r.status == "completed"]

    @property
    def failures(self) -> Counter:
        """Failure kind -> number of this config's runs that failed so."""
        return Counter(r.failure_kind for r in self.runs if r.status == "failed")

    @property
    def status(self) -> str:
        """completed, failed (every run failed), pruned or skipped (every run so) or mixed."""
        for only in ("pruned", "skipped"):
            if self.runs and all(r.status == only for r in self.runs):
                return only
        if not self.failures:
            return "completed"
        return "failed" if not self.completed else "mixed"

    def mean(self, metric: str) -> float:
        stat = self.stats.get(metric)
        return stat.mean if stat else math.nan


@dataclass
class Comparison:
    """Whether the leader of a ranking is ahead of the runner-up by more than their spread."""

    metric: str
    first: ConfigResult
    second: ConfigResult
    difference: float
    # Sum of the two standard deviations that exist (configs with n >= 2); NaN if neither.
    spread: float
    # True: within the spread (too close to call); False: clear lead; None: no spread to judge.
    close: bool | None
    # How many configs share the leader's mean (1: no tie).
    tied: int = 1


@dataclass
class Ranking:
    """Everything the report says about the configs of a set of runs."""

    # Completed or failed configs: ranked by speed per memory, then the ones without it.
    configs: list[ConfigResult]
    # Criterion -> configs that have a value for it, best first.
    by: dict[str, list[ConfigResult]]
    # The configs no other config beats on both criteria, fastest first.
    pareto: list[ConfigResult]
    # Criterion -> verdict on its top two (absent with fewer than two ranked configs).
    comparisons: dict[str, Comparison]
    # Swept setting -> its values, sorted.
    axes: dict[str, list[Any]]
    # How many completed runs are probes (probe.steps: speed and memory only).
    probes: int = 0
    # The accuracy comparisons behind the ties (None when no config trained to an eval).
    quality: QualityRanking | None = None
    # The configs in quality's order (its indices point here).
    quality_configs: list[ConfigResult] = field(default_factory=list)
    # The metrics the tables show, each config's mean and std among its stats (runs.report_metrics).
    metrics: tuple[str, ...] = SUMMARY_METRICS

    def tied_with_best(self) -> list[ConfigResult]:
        """The configs tied with the best on accuracy, best first."""
        return [c for c in self.by[PREFERENCE_ACCURACY] if c.versus_best and c.versus_best.tied_with_best]

    def labels(self) -> dict[str, str]:
        """Run name -> the label of its config, for the completed and failed runs."""
        return {run.name: config.label for config in self.configs for run in config.runs}


def _sort_key(value: Any) -> tuple:
    # Numbers in numeric order before text; None last.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    return (1 if value is not None else 2, 0, str(value))


def group_configs(runs: list[Run], metrics: tuple[str, ...] = SUMMARY_METRICS) -> list[ConfigResult]:
    """Completed and failed runs grouped by config, in the order first met, with the stats of `metrics`."""
    groups: dict[tuple, ConfigResult] = {}
    for run in runs:
        if run.status in FINISHED_STATUSES:
            groups.setdefault(run.config_key, ConfigResult(run.config_key, [])).runs.append(run)
    configs = list(groups.values())
    for config in configs:
        for metric in metrics:
            stat = Stat.of([r.metric(metric) for r in config.completed])
            if stat:
                config.stats[metric] = stat
    return configs


def swept_axes(configs: list[ConfigResult]) -> dict[str, list[Any]]:
    """Override keys whose value differs between configs, with their sorted values."""
    settings = [c.settings for c in configs]
    axes = {}
    for key in sorted({k for s in settings for k in s}):
        values = [s.get(key) for s in settings]
        distinct = {repr(v): v for v in values}
        if len(distinct) > 1:
            axes[key] = sorted(distinct.values(), key=_sort_key)
    return axes


def label_configs(configs: list[ConfigResult]) -> None:
    """Label each config by the overrides that differ between configs (all, if only one)."""
    common = set.intersection(*(set(c.overrides) for c in configs)) if len(configs) > 1 else set()
    for config in configs:
        config.label = " ".join(o for o in config.overrides if o not in common) or "(defaults)"
    # Same overrides, different base config (e.g. from two sweeps): add the sweep's name.
    counts = Counter(c.label for c in configs)
    for config in configs:
        if counts[config.label] > 1:
            config.label = f"{config.label} [{config.runs[0].sweep.name}]"
    counts = Counter(c.label for c in configs)
    seen: Counter = Counter()
    for config in configs:
        if counts[config.label] > 1:
            seen[config.label] += 1
            config.label = f"{config.label} #{seen[config.label]}"


def rank_by(configs: list[ConfigResult], metric: str) -> list[ConfigResult]:
    """Configs with a value for `metric`, best (highest mean) first; writes `ranks[metric]`."""
    ranked = sorted((c for c in configs if metric in c.stats), key=lambda c: -c.stats[metric].mean)
    for position, config in enumerate(ranked):
        previous = ranked[position - 1] if position else None
        tied = previous is not None and previous.stats[metric].mean == config.stats[metric].mean
        config.ranks[metric] = previous.ranks[metric] if tied else position + 1
    return ranked


def dominates(a: tuple[float, ...], b: tuple[float, ...], signs: tuple[int, ...] | None = None) -> bool:
    """Whether point `a` is at least as good as `b` everywhere and better somewhere.

    `signs`: +1 where higher is better (the default), -1 where lower is.
    """
    signs = signs or (1,) * len(a)
    at_least = all(s * p >= s * q for p, q, s in zip(a, b, signs))
    return at_least and any(s * p > s * q for p, q, s in zip(a, b, signs))


def pareto_front(configs: list[ConfigResult], x: str, y: str,
                 quality: tuple[QualityRanking, list[ConfigResult]] | None = None) -> list[ConfigResult]:
    """Configs that no other config dominates on (`x`, `y`), higher being better on both.

    With `quality` (the accuracy comparisons on `y` and the configs they index), `y` is compared with
    ties: a config is dominated only by one significantly better on `y` and at least as high on `x`;
    pairs it could not test (no records, no pair count) are compared by their means as before.
    """
    points = {id(c): (c.mean(x), c.mean(y)) for c in configs if x in c.stats and y in c.stats}
    position = {id(c): i for i, c in enumerate(quality[1])} if quality else {}

    def dominated_by(a: ConfigResult, b: ConfigResult) -> bool:
        i, j = position.get(id(a)), position.get(id(b))
        if quality and i is not None and j is not None and quality[0].tested is not None and quality[0].tested[j, i]:
            return bool(quality[0].better[j, i]) and b.mean(x) >= a.mean(x)
        return dominates(points[id(b)], points[id(a)])

    front = [c for c in configs if id(c) in points
             and not any(dominated_by(c, other) for other in configs if id(other) in points and other is not c)]
    return sorted(front, key=lambda c: (-c.mean(x), -c.mean(y)))


def config_eval(config: ConfigResult) -> ConfigEval | None:
    """What the accuracy comparison reads of a config: its runs' per-pair records, or their pair counts;
    None for configs with no trained eval (failed, probes)."""
    trained = [r for r in config.completed if not r.is_probe]
    if not trained:
        return None

    def unreadable(index: int, message: str) -> None:
        trained[index].problems.append(message + "; compared without it")

    return seeds_eval(config.label, [SeedRun(r.path, r.metric(PREFERENCE_ACCURACY), r.eval_pairs) for r in trained],
                      unreadable)


def compare_accuracy(configs: list[ConfigResult]) -> tuple[QualityRanking, list[ConfigResult]] | None:
    """Tie every config that trained against the best (writes `versus_best`); None when none did."""
    entries = [(c, e) for c in configs if (e := config_eval(c)) is not None]
    if not entries:
        return None
    compared = [c for c, _ in entries]
    quality = compare_with_best([e for _, e in entries])
    for config, versus in zip(compared, quality.versus):
        config.versus_best = versus
    return quality, compared


def compare_top_two(ranked: list[ConfigResult], metric: str) -> Comparison | None:
    if len(ranked) < 2:
        return None
    first, second = ranked[0], ranked[1]
    a, b = first.stats[metric], second.stats[metric]
    difference = a.mean - b.mean
    stds = [s.std for s in (a, b) if s.n >= 2]
    spread = sum(stds) if stds else math.nan
    if difference == 0:
        close: bool | None = True
    elif not stds:
        close = None
    else:
        close = difference < spread
    tied = sum(1 for c in ranked if c.stats[metric].mean == a.mean)
    return Comparison(metric, first, second, difference, spread, close, tied)


def rank_sweep(runs: list[Run]) -> Ranking:
    """Group, label, rank and compare the configs of `runs` by both criteria."""
    metrics = report_metrics(runs)
    configs = group_configs(runs, metrics)
    axes = swept_axes(configs)
    if configs:
        label_configs(configs)
    by = {metric: rank_by(configs, metric) for metric in CRITERIA}
    quality = compare_accuracy(configs)
    front = pareto_front(configs, *CRITERIA, quality=quality)
    for config in front:
        config.pareto = True
    comparisons = {m: c for m in CRITERIA if (c := compare_top_two(by[m], m))}
    if quality and quality[0].tests:  # the paired tests say who is tied on accuracy, not the seeds' spread
        comparisons.pop(PREFERENCE_ACCURACY, None)
    unranked = [c for c in configs if SPEED_PER_MEMORY not in c.stats]
    return Ranking(by[SPEED_PER_MEMORY] + unranked, by, front, comparisons, axes, count_probes(runs),
                   quality[0] if quality else None, quality[1] if quality else [], metrics)
