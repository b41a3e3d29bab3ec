"""The report's tables: rows for the CSV files and the dashboard, and the terminal summary.

Metric columns carry INTERFACE.md's names; `std(<metric>)` is the seeds' sample standard
deviation and `rank(<metric>)` the config's place when ranked by that metric.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path
from typing import Any

from dpo_sweeps.analysis.loss_metrics import LossMetric, loss_metric_rows
from dpo_sweeps.analysis.optuna_study import Study
from dpo_sweeps.analysis.ranking import CRITERIA, Comparison, ConfigResult, Ranking, Stat
from dpo_sweeps.analysis.recommendation import Recommendation, recommendation_lines, tied_recommendation_line
from dpo_sweeps.analysis.runs import (
    PREFERENCE_ACCURACY,
    SEED_KEYS,
    SPEED_PER_MEMORY,
    Run,
    count_probes,
)
from dpo_sweeps.ranking.ties import MEANS, PAIRED, UNPAIRED
from dpo_sweeps.rundir.cost import device_time_text

# The metrics the terminal table shows, besides the two criteria.
TERMINAL_METRICS = (SPEED_PER_MEMORY, PREFERENCE_ACCURACY, "perf/tokens_per_s_per_device", "perf/peak_memory_gib")


def format_number(value: Any) -> str:
    """Short human form: 12757, 41.3, 2.06, 0.9065; '' for missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.4f}" if magnitude >= 1e-3 or value == 0 else f"{value:.2e}"


def format_stat(stat: Stat | None) -> str:
    if stat is None:
        return ""
    if stat.n < 2:
        return format_number(stat.mean)
    return f"{format_number(stat.mean)} ± {format_number(stat.std)}"


def format_failures(failures: Counter) -> str:
    """Counter({'oom': 2}) -> 'oom ×2'."""
    return ", ".join(f"{kind} ×{count}" for kind, count in sorted(failures.items()))


def comparison_text(comparison: Comparison) -> str:
    """One sentence on whether a ranking's leader is ahead of the runner-up by more than noise."""
    first, second, metric = comparison.first, comparison.second, comparison.metric

    def described(config: ConfigResult) -> str:
        stat = config.stats[metric]
        return f"'{config.label}' {format_stat(stat)} (n={stat.n})"

    pair = f"{described(first)} vs {described(second)}"
    difference = format_number(comparison.difference)
    if comparison.tied > 1:
        return (f"{metric}: {comparison.tied} configs tie for first at {format_number(first.stats[metric].mean)}, "
                f"no single best: {pair}")
    if comparison.close is None:
        return f"{metric}: the top two differ by {difference} but ran one seed each, no spread to judge by: {pair}"
    if comparison.close:
        return (f"{metric}: the top two are within their spread (difference {difference} < spread "
                f"{format_number(comparison.spread)}), too close to call: {pair}")
    return (f"{metric}: the leader is ahead by {difference}, more than the spread "
            f"{format_number(comparison.spread)}: {pair}")


# Why a sweep of probes has no accuracy ranking and no Pareto front.
PROBES_NO_ACCURACY = "probes measure no accuracy"


def missing_text(ranking: Ranking, metric: str) -> str:
    """Why no config is ranked by `metric`."""
    if ranking.probes and metric != SPEED_PER_MEMORY:
        return "none: the completed runs are probes (probe.steps), which measure speed and memory only"
    return "no completed run reports it yet"


def best_text(ranking: Ranking, metric: str) -> str:
    """The leader by `metric` with its mean ± std and n, and how many configs tie with it."""
    ranked = ranking.by[metric]
    if not ranked:
        return missing_text(ranking, metric)
    stat = ranked[0].stats[metric]
    comparison = ranking.comparisons.get(metric)
    tie = f", tied with {comparison.tied - 1} other(s)" if comparison and comparison.tied > 1 else ""
    if metric == PREFERENCE_ACCURACY and ranking.quality and ranking.quality.tests:
        tie = f", tied with {len(ranking.tied_with_best()) - 1} other(s)" if len(ranking.tied_with_best()) > 1 else ""
    return f"'{ranked[0].label}' {format_stat(stat)} (n={stat.n}{tie})"


# Each config against the best on accuracy (dpo_sweeps/ranking/ties.py); ranking.csv's and the API's names.
VERSUS_BEST_COLUMNS = ["tied_with_best", "diff_vs_best", "diff_vs_best_ci95_low", "diff_vs_best_ci95_high",
                       "p_vs_best_adjusted", "rank_with_ties"]
# How it was compared, the config's own accuracy interval and the same comparison on the per-pair margin.
COMPARISON_COLUMNS = ["compared_by", "compared_on_pairs", "p_vs_best", "accuracy_ci95_low", "accuracy_ci95_high",
                      "accuracy_interval", "margin", "margin_diff_vs_best", "margin_diff_vs_best_ci95_low",
                      "margin_diff_vs_best_ci95_high", "margin_p_vs_best", "unranked_reason"]


def config_columns(ranking: Ranking) -> list[str]:
    metric_columns = [c for m in ranking.metrics for c in (m, f"std({m})")]
    return ([f"rank({m})" for m in CRITERIA] + ["pareto", "config", "status", "n", "failures"]
            + VERSUS_BEST_COLUMNS + list(ranking.axes) + metric_columns + COMPARISON_COLUMNS + ["runs"])


def versus_best_cells(config: ConfigResult) -> dict[str, Any]:
    """The config's comparison with the best as ranking.csv's cells (all None without one)."""
    versus = config.versus_best
    if versus is None:
        return dict.fromkeys(VERSUS_BEST_COLUMNS + COMPARISON_COLUMNS)
    return {
        "tied_with_best": versus.tied_with_best if versus.note is None else False,
        "diff_vs_best": versus.diff_vs_best, "diff_vs_best_ci95_low": versus.diff_vs_best_ci95_low,
        "diff_vs_best_ci95_high": versus.diff_vs_best_ci95_high, "p_vs_best_adjusted": versus.p_vs_best_adjusted,
        "rank_with_ties": versus.rank_with_ties, "compared_by": versus.method,
        "compared_on_pairs": versus.compared_on_pairs, "p_vs_best": versus.p_vs_best,
        "accuracy_ci95_low": versus.accuracy_ci95[0], "accuracy_ci95_high": versus.accuracy_ci95[1],
        "accuracy_interval": versus.accuracy_interval, "margin": versus.score_name,
        "margin_diff_vs_best": versus.score_diff_vs_best,
        "margin_diff_vs_best_ci95_low": versus.score_diff_vs_best_ci95_low,
        "margin_diff_vs_best_ci95_high": versus.score_diff_vs_best_ci95_high,
        "margin_p_vs_best": versus.score_p_vs_best, "unranked_reason": versus.note,
    }


def config_rows(ranking: Ranking) -> list[dict[str, Any]]:
    """One row per config, in ranking order; metric cells are means over completed seeds."""
    rows = []
    for config in ranking.configs:
        row: dict[str, Any] = {f"rank({m})": config.ranks.get(m) for m in CRITERIA}
        row.update(pareto=config.pareto, config=config.label, status=config.status, n=len(config.completed),
                   failures=format_failures(config.failures))
        row.update(versus_best_cells(config))
        row.update({axis: config.settings.get(axis) for axis in ranking.axes})
        for metric in ranking.metrics:
            stat = config.stats.get(metric)
            row[metric] = stat.mean if stat else None
            row[f"std({metric})"] = stat.std if stat and stat.n > 1 else None
        row["runs"] = " ".join(r.name for r in config.runs)
        rows.append(row)
    return rows


def run_columns(ranking: Ranking) -> list[str]:
    return (["run", "status", "failure.kind", "failure.message", "config", "plan", *sorted(SEED_KEYS), "last_step",
             *ranking.metrics, "overrides", "problems"])


def run_rows(runs: list[Run], ranking: Ranking) -> list[dict[str, Any]]:
    """One row per run directory: completed, failed, pending and unreadable alike."""
    labels = ranking.labels()
    rows = []
    for run in runs:
        row: dict[str, Any] = {
            "run": run.name, "status": run.status, "failure.kind": run.failure_kind,
            "failure.message": run.failure_message, "config": labels.get(run.name, " ".join(run.config_overrides)),
            "plan": run.plan["label"] if run.plan else None,  # what ran: FULL_SHARD bf16, ... (summary.json's plan)
            "last_step": run.last_logged_step,
        }
        row.update({key: run.config.get(key) for key in SEED_KEYS})
        row.update({metric: run.metrics.get(metric) for metric in ranking.metrics})
        row.update(overrides=" ".join(run.overrides), problems="; ".join(run.problems))
        rows.append(row)
    return rows


def write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> Path:
    """Missing and NaN cells stay empty; numbers keep every digit of summary.json."""
    def cell(value: Any) -> Any:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        return value

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({column: cell(row.get(column)) for column in columns})
    return path


def cost_text(runs: list[Run]) -> str:
    """What the runs cost: GPU-hours and/or CPU rank-seconds (ranks x wall time), summed."""
    spent: dict[str, float] = {}
    for run in runs:
        if run.device_seconds is not None:
            spent[run.device_kind] = spent.get(run.device_kind, 0.0) + run.device_seconds
    return f"cost: {device_time_text(spent)} (ranks x wall time, summed over runs)"


def status_line(runs: list[Run], not_started: int | None = None) -> str:
    """'11 runs: 9 completed, 1 failed (oom ×1), 1 pending (...)'; `not_started`: jobs planned
    by the sweep that have no run directory yet."""
    counts = Counter(r.status for r in runs)
    probes = count_probes(runs)
    parts = [f"{counts['completed']} completed" + (f" ({probes} of them probes)" if probes else "")]
    failures = Counter(r.failure_kind for r in runs if r.status == "failed")
    parts.append(f"{counts['failed']} failed" + (f" ({format_failures(failures)})" if failures else ""))
    if counts["pruned"]:
        parts.append(f"{counts['pruned']} pruned (stopped early by the Optuna pruner)")
    if counts["skipped"]:
        parts.append(f"{counts['skipped']} skipped (predicted out of memory, not started)")
    if counts["pending"]:
        parts.append(f"{counts['pending']} pending (still running, or stopped before writing summary.json)")
    if counts["unreadable"]:
        parts.append(f"{counts['unreadable']} unreadable (listed below, and in runs.csv 'problems')")
    if not_started:
        parts.append(f"{not_started} more planned by the sweep, not started yet")
    return f"{len(runs)} run{'s' if len(runs) != 1 else ''}: " + ", ".join(parts)


def file_problem_lines(runs: list[Run]) -> list[str]:
    """One screen line per run file that could not be read (wholly or in part), naming the file."""
    lines = []
    for run in runs:
        for problem in run.problems:
            file, _, rest = problem.partition(" ")
            named = file.endswith((".json", ".jsonl", ".yaml", ".parquet")) and rest
            lines.append(f"  unreadable: {run.path / file}: {rest}" if named else f"  unreadable: {run.path}: {problem}")
    return lines


def _grid(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    # Right-align numbers, left-align the last column (the config label).
    lines = []
    for row in [header, *rows]:
        cells = [str(c).rjust(w) for c, w in zip(row[:-1], widths[:-1])] + [str(row[-1])]
        lines.append("  ".join(cells).rstrip())
    return lines


def terminal_table(ranking: Ranking) -> list[str]:
    header = ["#spm", "#acc", "P", "n", *TERMINAL_METRICS, "config"]
    rows = []
    for config in ranking.configs:
        if not config.completed:
            cells = ["-", "-", "", "0", f"failed: {format_failures(config.failures)}", "", "", ""]
        else:
            cells = [str(config.ranks.get(m, "-")) for m in CRITERIA]
            cells += ["*" if config.pareto else "", str(len(config.completed))]
            cells += [format_stat(config.stats.get(m)) for m in TERMINAL_METRICS]
            if config.failures:
                cells[3] += f" (+{format_failures(config.failures)})"
        rows.append(cells + [config.label])
    legend = (f"#spm, #acc: rank by {SPEED_PER_MEMORY}, {PREFERENCE_ACCURACY}; P: * on the Pareto front; "
              "n: completed seeds; values are mean ± std over seeds")
    return _grid(header, rows) + [legend]


def study_lines(study: Study) -> list[str]:
    if study.problem:
        return [f"Optuna study in {study.sweep}: {study.problem}"]
    states = Counter(t.state for t in study.trials)
    objectives = ", ".join(f"{o} ({d})" for o, d in zip(study.objectives, study.directions))
    lines = [f"Optuna study '{study.name}' ({study.sweep}): {len(study.trials)} trials "
             f"({', '.join(f'{n} {s.lower()}' for s, n in sorted(states.items()))}); objectives: {objectives or '?'}"]
    kind = "best trial" if len(study.directions) == 1 else "Pareto trials"
    for trial in study.best_trials:
        params = " ".join(f"{k}={v}" for k, v in trial.params.items())
        values = ", ".join(format_number(v) for v in trial.values or ())
        lines.append(f"  {kind}: #{trial.number} ({trial.run or 'no run dir'}) {params} -> {values}")
    if not study.best_trials and study.results:
        lines.append(f"  optimization_results.yaml: {study.results}")
    return lines


def loss_metric_lines(rows: list[LossMetric]) -> list[str]:
    """Each config's own loss metrics on one line (ORPO's log odds ratio, SimPO's margin over gamma, ...)."""
    if not rows:
        return []
    lines = ["Each loss's own metrics (eval, mean over completed seeds):"]
    by_config: dict[str, list[LossMetric]] = {}
    for row in rows:
        by_config.setdefault(row.config, []).append(row)
    for config, metrics in by_config.items():
        values = "  ".join(f"{m.metric.removeprefix('eval/')} {format_stat(m.stat)}" for m in metrics)
        lines.append(f"  '{config}' ({metrics[0].loss}): {values}")
    return lines


LOSS_METRIC_COLUMNS = ["config", "loss.name", "metric", "mean", "std", "n"]


def loss_metric_csv_rows(rows: list[LossMetric]) -> list[dict[str, Any]]:
    return [{"config": r.config, "loss.name": r.loss, "metric": r.metric, "mean": r.stat.mean,
             "std": r.stat.std if r.stat.n > 1 else None, "n": r.stat.n} for r in rows]


def points(value: float) -> str:
    """An accuracy difference in percentage points: -0.0213 -> '-2.1 points'."""
    return f"{100 * value:+.1f} points" if math.isfinite(value) else "?"


def _interval(low: float, high: float) -> str:
    return f"[{100 * low:+.1f}, {100 * high:+.1f}]" if math.isfinite(low) and math.isfinite(high) else ""


# How each kind of comparison was made, for the report's lines.
METHOD_TEXT = {
    PAIRED: "paired on the held-out pairs they share (McNemar's exact test; a t-test of per-pair seed means "
            "with several seeds)",
    UNPAIRED: "unpaired, without per-pair records (score test; Newcombe's interval from Wilson's)",
    MEANS: "by their means alone (no per-pair records and no held-out pair count to test with)",
}


def quality_lines(ranking: Ranking) -> list[str]:
    """What the accuracy comparison found: the tied set, how configs were compared, what the held-out set
    can resolve, the pick; empty when no config trained to an eval."""
    quality = ranking.quality
    if quality is None or quality.best is None:
        return []
    configs = ranking.quality_configs
    best = configs[quality.best]
    tied = ranking.tied_with_best()
    ranked = [c for c in configs if c.versus_best and c.versus_best.note is None]
    methods = sorted({c.versus_best.method for c in ranked if c.versus_best.method})
    described = "; ".join(
        f"'{c.label}'" + ("" if c is best else f" {points(c.versus_best.diff_vs_best)} "
                                               f"{_interval(c.versus_best.diff_vs_best_ci95_low, c.versus_best.diff_vs_best_ci95_high)}".rstrip())
        for c in tied)
    unranked = [f"  ranked last ({c.versus_best.rank_with_ties}), no accuracy: '{c.label}' ({c.versus_best.note})"
                for c in configs if c.versus_best and c.versus_best.note]
    if not quality.tests:
        means = ["Accuracy compared by the means alone: the runs wrote no per-pair records (eval_pairs.parquet) and "
                 "no held-out pair count, so nothing can be tested; ties are equal means"]
        return (means if len(ranked) > 1 else []) + unranked
    lines = [f"Tied with the best accuracy ({len(tied)} of {len(ranked)}; Holm over {quality.tests} comparison(s), "
             f"alpha 0.05; differences with their 95% interval, each on its own, not adjusted): {described}"]
    for method in methods:
        lines.append(f"  compared {METHOD_TEXT[method]}")
    if quality.unpaired and any(c.versus_best.method == PAIRED for c in ranked):
        lines.append(f"  without per-pair records (unpaired Wilson intervals): {', '.join(repr(x) for x in quality.unpaired)}")
    for a, b, shared, most in quality.partial_overlaps[:5]:
        lines.append(f"  held-out pairs differ: '{a}' and '{b}' compared on the {shared} pair(s) they share (of {most})")
    if len(quality.partial_overlaps) > 5:
        lines.append(f"  ... and {len(quality.partial_overlaps) - 5} more comparisons on partly shared pairs")
    lines += unranked
    resolution = quality.resolution
    if math.isfinite(resolution.minimum_detectable_difference):
        lines.append(f"What the held-out set can resolve: {100 * resolution.minimum_detectable_difference:.1f} points of "
                     f"accuracy with {resolution.pairs} pairs ({resolution.method}; 80% power at alpha "
                     f"{resolution.alpha:.2g}, Holm's strictest step, at the observed agreement between configs)")
    if resolution.mostly_tied and resolution.gap_config:
        more = (f"about {resolution.pairs_to_resolve:,} held-out pairs would resolve it" if resolution.pairs_to_resolve
                else "no pair count would resolve it")
        lines.append(f"Most configs are tied ({resolution.tied} of {resolution.ranked}): the largest gap within the tied "
                     f"set is {100 * resolution.gap:.1f} points ('{resolution.gap_config}'); {more} at 80% power")
    if pick := tied_recommendation_line(ranking):
        lines.append(pick)
    return lines


def terminal_report(sources: list[Path], runs: list[Run], ranking: Ranking, studies: list[Study],
                    not_started: int | None = None, recommendations: list[Recommendation] | None = None) -> str:
    """The compact summary printed by `report.py`."""
    lines = [f"DPO sweep report: {', '.join(str(s) for s in sources)}", status_line(runs, not_started),
             *file_problem_lines(runs), cost_text(runs), ""]
    for rec in recommendations or []:
        lines += [*recommendation_lines(rec), ""]
    for metric in CRITERIA:
        lines.append(f"Best by {metric}: {best_text(ranking, metric)}")
    nobody = f"none: {PROBES_NO_ACCURACY}" if ranking.probes else "none yet (no completed run has both criteria)"
    pareto = "; ".join(f"'{c.label}'" for c in ranking.pareto) or nobody
    lines.append(f"Pareto set ({len(ranking.pareto)}): {pareto}")
    lines += [f"Note: {comparison_text(c)}" for c in ranking.comparisons.values()]
    lines += quality_lines(ranking)
    if ranking.configs:
        lines += ["", *terminal_table(ranking)]
    if own := loss_metric_lines(loss_metric_rows(ranking)):
        lines += ["", *own]
    for study in studies:
        lines += ["", *study_lines(study)]
    return "\n".join(lines)
