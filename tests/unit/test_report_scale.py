"""A report of a sweep too large to draw run by run stays readable (issue 23, point 5).

The sweep here is written by support.reports (real summary.json and metrics.jsonl files): 32 configs
with two seeds each, 64 runs, past the figures' limits for every run's curve (48) and for a label per
config on the Pareto figure (20). The figures are the report's own (analysis.figures), built from what
analysis.runs reads back, and the best configs are worked out here from the summaries, independently.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from support.reports import write_completed

from dpo_sweeps.analysis import dashboard, figures
from dpo_sweeps.analysis.ranking import rank_sweep
from dpo_sweeps.analysis.runs import load_runs

PLANS = [(sharding, precision) for sharding in ("full_shard", "shard_grad_op") for precision in ("fp32", "bf16")]
BETAS = [0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6]
SEEDS = (0, 1)


def _large_sweep(sweep: Path) -> Path:
    job = 0
    for sharding, precision in PLANS:
        for beta in BETAS:
            for seed in SEEDS:
                write_completed(sweep / str(job), job, sharding, precision, beta, seed=seed, seed_override=True)
                job += 1
    return sweep


def _mean_accuracies(sweep: Path) -> dict[str, float]:
    """Each config's (overrides without the seed) mean final preference accuracy."""
    by_config: dict[str, list[float]] = {}
    for path in sweep.glob("*/summary.json"):
        summary = json.loads(path.read_text())
        config = " ".join(o for o in summary["overrides"] if not o.startswith("train.seed="))
        by_config.setdefault(config, []).append(summary["metrics"]["eval/rewards/accuracies"])
    return {config: statistics.fmean(values) for config, values in by_config.items()}


def test_past_48_runs_the_curves_are_one_run_of_each_of_the_12_best_configs(tmp_path):
    sweep = _large_sweep(tmp_path / "sweep")
    runs, _ = load_runs([sweep])
    assert len(runs) == len(PLANS) * len(BETAS) * len(SEEDS) > figures.MAX_CURVE_PANELS
    ranking = rank_sweep(runs)
    figure = figures.curves_figure(runs, ranking.labels(), ranking)
    panels = [axes for axes in figure.axes if axes.get_visible() and axes.get_title()]
    assert len(panels) == figures.TOP_CURVE_CONFIGS
    # Each panel's title opens with its run's folder; the runs shown are one of each best config.
    shown = [panel.get_title().split(" ", 1)[0] for panel in panels]
    overrides = {run.name: " ".join(o for o in run.config_overrides if not o.startswith("train.seed="))
                 for run in runs}
    assert len({overrides[name] for name in shown}) == len(shown)
    # ... and no config left out is better than one shown (ties may go either way).
    accuracy = _mean_accuracies(sweep)
    shown_configs = {overrides[name] for name in shown}
    assert min(accuracy[c] for c in shown_configs) >= max(accuracy[c] for c in accuracy if c not in shown_configs)


def test_past_20_configs_the_pareto_figure_names_only_the_front(tmp_path):
    runs, _ = load_runs([_large_sweep(tmp_path / "sweep")])
    ranking = rank_sweep(runs)
    assert len(ranking.configs) == len(PLANS) * len(BETAS) > figures.MAX_LABELLED_CONFIGS
    axes = figures.pareto_figure(ranking).axes[0]
    labels = {text.get_text().replace("\n", " ") for text in axes.texts}
    front = {config.label for config in ranking.pareto}
    assert 0 < len(front) < len(ranking.configs)
    assert labels == front  # the other configs are unlabelled points
    assert any(f"other configs ({len(ranking.configs) - len(front)})" in t.get_text()
               for t in axes.get_legend().get_texts())


def test_a_table_past_1000_rows_shows_the_first_1000_and_says_where_the_rest_are():
    rows = [("", [f'<td data-value="{i}">{i}</td>']) for i in range(dashboard.MAX_TABLE_ROWS + 1)]
    html = dashboard._table("runs", ["n"], rows, "filter", csv_name="runs.csv")
    assert html.count("<tr class=") == dashboard.MAX_TABLE_ROWS
    assert f">{dashboard.MAX_TABLE_ROWS - 1}</td>" in html and f">{dashboard.MAX_TABLE_ROWS}</td>" not in html
    assert "The first 1,000 of 1,001 rows" in html and "runs.csv" in html
    short = dashboard._table("runs", ["n"], rows[:3], "filter", csv_name="runs.csv")
    assert short.count("<tr class=") == 3 and "The first" not in short
