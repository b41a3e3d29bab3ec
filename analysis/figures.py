"""The report's plots as matplotlib figures: Pareto scatter, effects per swept setting,
sharding x precision heatmap, training curves per run, an Optuna study's trials.

Figures are built on `matplotlib.figure.Figure` directly, never pyplot, so no display or
interactive backend is involved; each function returns None when it has nothing to draw.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections import Counter, defaultdict
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator
from matplotlib.transforms import Bbox

from dpo_sweeps.analysis.optuna_study import Study
from dpo_sweeps.analysis.ranking import CRITERIA, Ranking
from dpo_sweeps.analysis.runs import FINISHED_STATUSES, PREFERENCE_ACCURACY, SPEED_PER_MEMORY, Run
from dpo_sweeps.analysis.tables import format_failures, format_number

PARETO_COLOR = "#d1495b"
POINT_COLOR = "#5b6f95"
LOSS_COLOR = "#2e6fba"
ACCURACY_COLOR = "#e07b18"
FAILED_COLOR = "#b3261e"
TIED_COLOR = "#2a9d8f"
MEAN_COLOR = "#1f2430"
# Every figure is this wide (at png_bytes' dpi, 880 px): the dashboard shows it at its own size, unscaled, from
# a 1,000 px wide window up, so its text is as large on the page as below.
FIGURE_WIDTH_IN = 8.0
# No text of a figure is smaller (at 110 dpi, 12 px: legible unscaled).
SMALLEST_FONT_PT = 8
MAX_CURVE_PANELS = 48
TOP_CURVE_CONFIGS = 12
CURVE_COLUMNS = 3
# Past this many configs the Pareto figure names only the front's (the rest are unlabelled points).
MAX_LABELLED_CONFIGS = 20
# Cells where every run failed (or none ran) show grey.
HEATMAP_COLORS = colormaps["viridis"].with_extremes(bad="#e6e6e6")
AXIS_TITLES = {
    SPEED_PER_MEMORY: f"{SPEED_PER_MEMORY}\n(tokens/s per device / peak GiB)",
    PREFERENCE_ACCURACY: f"{PREFERENCE_ACCURACY}\n(final preference accuracy)",
}


def png_bytes(figure: Figure, dpi: int = 110) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, facecolor="white")
    return buffer.getvalue()


def _std_or_none(stat) -> float | None:
    return stat.std if stat.n > 1 else None


def _accuracy_bar(config, stat) -> tuple[list[list[float]] | None, bool]:
    """The accuracy's 95% interval as an error bar (below, above the mean), else its std; whether tied."""
    versus = config.versus_best
    if versus is None:
        return _std_or_none(stat), False
    low, high = versus.accuracy_ci95
    if math.isfinite(low) and math.isfinite(high):
        return [[max(0.0, stat.mean - low)], [max(0.0, high - stat.mean)]], versus.tied_with_best
    return _std_or_none(stat), versus.tied_with_best


def pareto_figure(ranking: Ranking) -> Figure | None:
    """Configs by speed per memory (mean ± std) and accuracy (mean and its 95% interval, else ± std); the
    Pareto front joined up, the configs tied with the best accuracy ringed. Each config is named by a
    label placed where it overlaps no other label, point or the legend (`_place_labels`)."""
    x_metric, y_metric = CRITERIA
    points = [c for c in ranking.configs if x_metric in c.stats and y_metric in c.stats]
    if not points:
        return None
    figure = Figure(figsize=(FIGURE_WIDTH_IN, 5.8), layout="constrained")
    axes = figure.add_subplot()
    every_point = [(c.mean(x_metric), c.mean(y_metric)) for c in points]
    crowded = len(points) > MAX_LABELLED_CONFIGS
    if crowded:  # thousands of error bars and labels: the front stays readable, the rest a cloud
        rest = [c for c in points if not c.pareto]
        axes.scatter([c.mean(x_metric) for c in rest], [c.mean(y_metric) for c in rest], s=9, color=POINT_COLOR,
                     alpha=0.5, zorder=2, label=f"other configs ({len(rest)})")
        points = [c for c in points if c.pareto]
    tied_labelled = False
    for config in points:
        x, y = config.stats[x_metric], config.stats[y_metric]
        color = PARETO_COLOR if config.pareto else POINT_COLOR
        accuracy_bar, tied = _accuracy_bar(config, y)
        axes.errorbar(x.mean, y.mean, xerr=_std_or_none(x), yerr=accuracy_bar, fmt="o", color=color,
                      markersize=8 if config.pareto else 6, capsize=3, zorder=3)
        if tied:  # a ring around the configs tied with the best accuracy
            axes.scatter([x.mean], [y.mean], s=260, facecolors="none", edgecolors=TIED_COLOR, linewidths=1.5,
                         zorder=3, label=None if tied_labelled else "tied with the best accuracy")
            tied_labelled = True
    front = sorted(ranking.pareto, key=lambda c: c.mean(x_metric))
    if ranking.quality and ranking.quality.tests:
        # With ties the front is every config nothing significantly better and faster beats: not a staircase
        # to join up, so its points are marked in red only.
        axes.plot([], [], "o", color=PARETO_COLOR, label=f"Pareto front with ties ({len(front)} configs)")
    else:
        axes.plot([c.mean(x_metric) for c in front], [c.mean(y_metric) for c in front], "--", color=PARETO_COLOR,
                  alpha=0.6, zorder=2, label=f"Pareto front ({len(front)} configs)")
    failed = [c for c in ranking.configs if not c.completed]
    notes = []
    if failed:
        text = "not plotted (every run failed):\n" + "\n".join(
            f"{c.label}: {format_failures(c.failures)}" for c in failed[:8])
        notes.append(axes.text(0.01, 0.01, text, transform=axes.transAxes, fontsize=SMALLEST_FONT_PT,
                               color=FAILED_COLOR, va="bottom"))
    axes.set_xlabel(AXIS_TITLES[x_metric])
    axes.set_ylabel(AXIS_TITLES[y_metric])
    intervals = any(c.versus_best and math.isfinite(c.versus_best.accuracy_ci95[0]) for c in points)
    axes.set_title("Speed per memory vs preference accuracy\n(higher is better on both"
                   + ("; accuracy bars: 95% intervals)" if intervals else ")"), fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize=SMALLEST_FONT_PT)
    axes.margins(x=0.2, y=0.15)
    # The front's labels first: where space runs short, they get the places nearest their points.
    labelled = sorted(points, key=lambda c: (not c.pareto, c.mean(x_metric)))
    _place_labels(figure, axes, [(textwrap.fill(c.label, 36), (c.mean(x_metric), c.mean(y_metric)),
                                  "#222" if c.pareto else "#555") for c in labelled], every_point, notes)
    return figure


# Where a label may go around its point: directions (the nearest first: right, left, above, below, then the
# diagonals) and distances in points; past the first distance a thin line joins it to its point.
LABEL_DIRECTIONS = (0, 180, 90, 270, 45, 135, 315, 225, 20, 160, 340, 200, 70, 110, 290, 250)
LABEL_DISTANCES_PT = (6, 18, 32, 50, 72, 100, 135)
# The box a point's marker (ring included) takes, in points either side of its centre.
MARKER_HALF_PT = 8


def _place_labels(figure: Figure, axes, labels: list[tuple[str, tuple[float, float], str]],
                  points: list[tuple[float, float]], notes: list) -> None:
    """Annotates each (text, (x, y), color) at the first place around its point, nearest first, where its
    box stays inside the axes and overlaps no label placed before it, no point's marker, the legend or
    `notes`; where none is free, at the place overlapping least. Greedy, as label placers are (an
    exact placement is NP-hard): with the front labelled first, it finds room for the few dozen labels
    the figure draws."""
    renderer = FigureCanvasAgg(figure).get_renderer()  # the canvas png_bytes draws on: the same text extents
    figure.draw_without_rendering()  # the constrained layout settles, so display coordinates hold
    legend = axes.get_legend()
    if legend is not None:  # 'best' was chosen among the points; the labels must not move it onto them
        where = legend.get_window_extent().transformed(axes.transAxes.inverted())
        legend.set_loc((where.x0, where.y0))
    pixels = figure.dpi / 72
    inside = axes.get_window_extent().padded(-2)
    half = MARKER_HALF_PT * pixels
    taken = [Bbox.from_extents(px - half, py - half, px + half, py + half)
             for px, py in axes.transData.transform(points)]
    taken += [artist.get_window_extent(renderer) for artist in [legend, *notes] if artist is not None]
    for text, (x, y), color in labels:
        px, py = axes.transData.transform((x, y))
        probe = axes.text(0, 0, text, fontsize=SMALLEST_FONT_PT, linespacing=1.1)
        extent = probe.get_window_extent(renderer)
        probe.remove()
        width, height = extent.width, extent.height
        best = None
        for distance in LABEL_DISTANCES_PT:
            for degrees in LABEL_DIRECTIONS:
                dx, dy = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
                ha = "left" if dx > 0.3 else "right" if dx < -0.3 else "center"
                va = "bottom" if dy > 0.3 else "top" if dy < -0.3 else "center"
                gap = half + distance * pixels
                anchor_x, anchor_y = px + dx * gap, py + dy * gap
                x0 = anchor_x if ha == "left" else anchor_x - width if ha == "right" else anchor_x - width / 2
                y0 = anchor_y if va == "bottom" else anchor_y - height if va == "top" else anchor_y - height / 2
                box = Bbox.from_bounds(x0, y0, width, height)
                if not (inside.contains(x0, y0) and inside.contains(x0 + width, y0 + height)):
                    continue
                overlap = sum(_overlap_area(box, other) for other in taken)
                if best is None or overlap < best[0]:
                    best = (overlap, box, ((anchor_x - px) / pixels, (anchor_y - py) / pixels), ha, va, distance)
                if overlap == 0:
                    break
            if best is not None and best[0] == 0:
                break
        if best is None:  # no place inside the axes at all (a label wider than the plot): beside the point
            box = Bbox.from_bounds(px + half, py, width, height)
            best = (0.0, box, (MARKER_HALF_PT, 0.0), "left", "center", LABEL_DISTANCES_PT[0])
        _, box, offset, ha, va, distance = best
        leader = dict(arrowstyle="-", color="#999", linewidth=0.6, shrinkA=0, shrinkB=half / pixels)
        axes.annotate(text, (x, y), xytext=offset, textcoords="offset points", fontsize=SMALLEST_FONT_PT,
                      linespacing=1.1, color=color, ha=ha, va=va, zorder=4,
                      arrowprops=leader if distance > LABEL_DISTANCES_PT[0] else None)
        taken.append(box)


def _overlap_area(a: Bbox, b: Bbox) -> float:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width * height if width > 0 and height > 0 else 0.0


def _positions(values: list[Any]) -> tuple[dict[Any, float], bool, bool]:
    """x position of each setting value; whether the values are numbers; whether to use log x."""
    numeric = len(values) > 1 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric:
        log = min(values) > 0 and max(values) / min(values) >= 10
        return {v: float(v) for v in values}, True, log
    return {v: float(i) for i, v in enumerate(values)}, False, False


def _padded(positions: list[float], log: bool) -> tuple[float, float]:
    """x limits that show every setting value, failed-only ones included."""
    low, high = min(positions), max(positions)
    if log:
        factor = (high / low) ** 0.08
        return low / factor, high * factor
    pad = (high - low) * 0.08 or 0.5
    return low - pad, high + pad


def _ticks_fit(positions: list[float], log: bool) -> bool:
    """Whether a tick at every value stays readable (few values, none crowding the next)."""
    scaled = sorted(math.log(p) if log else p for p in positions)
    span = scaled[-1] - scaled[0]
    return len(scaled) <= 6 and all(b - a >= 0.07 * span for a, b in zip(scaled, scaled[1:]))


def effects_figure(ranking: Ranking) -> Figure | None:
    """For each swept setting, both criteria against its values: runs as dots, means as a line."""
    if not ranking.axes:
        return None
    figure = Figure(figsize=(FIGURE_WIDTH_IN, 2.9 * len(ranking.axes) + 0.5), layout="constrained")
    grid = figure.subplots(len(ranking.axes), len(CRITERIA), squeeze=False)
    any_failure = False
    for row, (axis_name, values) in enumerate(ranking.axes.items()):
        positions, numeric, log = _positions(values)
        for column, metric in enumerate(CRITERIA):
            axes = grid[row][column]
            per_value: dict[Any, list[float]] = defaultdict(list)
            failures: dict[Any, Counter] = defaultdict(Counter)
            for config in ranking.configs:
                value = config.settings.get(axis_name)
                if value not in positions:
                    continue
                per_value[value] += [r.metric(metric) for r in config.completed if math.isfinite(r.metric(metric))]
                failures[value].update(config.failures)
            for value, samples in per_value.items():
                axes.scatter([positions[value]] * len(samples), samples, s=14, color=POINT_COLOR, alpha=0.5, zorder=2)
            means = [(positions[v], float(np.mean(per_value[v]))) for v in values if per_value.get(v)]
            if means:
                # Join means with a line only where the setting is a number; categories have no order.
                style = "-o" if numeric else "o"
                axes.plot(*zip(*means), style, color=MEAN_COLOR, zorder=3, markersize=6, label="mean")
            for value, counter in failures.items():
                if counter:
                    any_failure = True
                    axes.annotate(format_failures(counter), (positions[value], 1.0), xycoords=("data", "axes fraction"),
                                  xytext=(0, -10), textcoords="offset points", ha="center", fontsize=SMALLEST_FONT_PT,
                                  color=FAILED_COLOR)
            if log:
                axes.set_xscale("log")
            if not numeric or _ticks_fit(list(positions.values()), log):
                axes.set_xticks(list(positions.values()), [str(v) for v in positions])
            elif log:  # 0.05, 0.1, 0.2, 0.5 rather than 10^-1
                axes.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                axes.xaxis.set_major_formatter(FormatStrFormatter("%g"))
            axes.set_xlim(*_padded(list(positions.values()), log))
            axes.minorticks_off()
            axes.set_xlabel(axis_name, fontsize=9)
            axes.set_ylabel(metric, fontsize=SMALLEST_FONT_PT)
            axes.tick_params(labelsize=SMALLEST_FONT_PT)
            axes.grid(alpha=0.3)
            axes.margins(y=0.18)
    # The caption names what is drawn: the failures' note only where a run failed.
    failures_note = "; red at the top: failed runs by kind" if any_failure else ""
    figure.suptitle(f"Effect of each swept setting (blue dots: runs; black: mean per value{failures_note})",
                    fontsize=10)
    return figure


def heatmap_figure(runs: list[Run]) -> Figure | None:
    """Mean speed per memory and accuracy per sharding x precision cell, as the runs' parallel plans name
    what ran (`Run.strategy_label`, `Run.precision_label`): fsdp=full_shard fsdp.reshard_after_forward=false
    is a SHARD_GRAD_OP run."""
    finished = [r for r in runs if r.status in FINISHED_STATUSES]
    shardings = sorted({str(r.strategy_label) for r in finished if r.strategy_label is not None})
    precisions = sorted({str(r.precision_label) for r in finished if r.precision_label is not None})
    if not shardings or not precisions or len(shardings) * len(precisions) < 2:
        return None
    figure = Figure(figsize=(FIGURE_WIDTH_IN, 1.1 * len(shardings) + 2.2), layout="constrained")
    for index, metric in enumerate(CRITERIA):
        axes = figure.add_subplot(1, len(CRITERIA), index + 1)
        means = np.full((len(shardings), len(precisions)), np.nan)
        notes = [["" for _ in precisions] for _ in shardings]
        for i, sharding in enumerate(shardings):
            for j, precision in enumerate(precisions):
                cell = [r for r in finished if str(r.strategy_label) == sharding
                        and str(r.precision_label) == precision]
                values = [r.metric(metric) for r in cell if r.status == "completed" and math.isfinite(r.metric(metric))]
                failures = Counter(r.failure_kind for r in cell if r.status == "failed")
                lines = [f"{format_number(float(np.mean(values)))}\nn={len(values)}"] if values else []
                if values:
                    means[i, j] = np.mean(values)
                if failures:
                    lines.append(format_failures(failures))
                notes[i][j] = "\n".join(lines) or "no runs"
        image = axes.imshow(np.ma.masked_invalid(means), cmap=HEATMAP_COLORS, aspect="auto")
        finite = means[np.isfinite(means)]
        middle = (finite.min() + finite.max()) / 2 if finite.size else 0
        for i in range(len(shardings)):
            for j in range(len(precisions)):
                dark = np.isfinite(means[i, j]) and means[i, j] < middle
                if np.isfinite(means[i, j]):
                    color = "white" if dark else "black"
                else:
                    color = FAILED_COLOR if notes[i][j] != "no runs" else "#777"
                axes.text(j, i, notes[i][j], ha="center", va="center", fontsize=SMALLEST_FONT_PT, color=color)
        axes.set_xticks(range(len(precisions)), precisions)
        axes.set_yticks(range(len(shardings)), shardings)
        axes.tick_params(labelsize=SMALLEST_FONT_PT)
        axes.set_xlabel("precision (as run)", fontsize=9)
        axes.set_ylabel("sharding (as run)", fontsize=9)
        axes.set_title(f"{metric}\n(mean over runs; other settings pooled)", fontsize=9)
        figure.colorbar(image, ax=axes, shrink=0.8).ax.tick_params(labelsize=SMALLEST_FONT_PT)
    return figure


def _series(log: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in log if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def curves_figure(runs: list[Run], labels: dict[str, str], ranking: Ranking | None = None) -> Figure | None:
    """Loss and preference accuracy against step, one panel per run (`labels`: run name -> config).
    Past MAX_CURVE_PANELS runs, one run of each of the TOP_CURVE_CONFIGS best configs by preference
    accuracy (`ranking`), not the first runs found."""
    shown = [r for r in runs if r.has_log or r.status == "failed"]
    if len(shown) > MAX_CURVE_PANELS and ranking is not None and ranking.by.get(PREFERENCE_ACCURACY):
        best = [next((r for r in c.completed if r.has_log), c.runs[0]) for c in ranking.by[PREFERENCE_ACCURACY]]
        shown = best[:TOP_CURVE_CONFIGS]
        more = f" of the {len(shown)} configs with the best preference accuracy (of {len(runs)} runs)"
    else:
        shown = shown[:MAX_CURVE_PANELS]
        more = f" (first {MAX_CURVE_PANELS} of {len(runs)} runs)" if len(runs) > MAX_CURVE_PANELS else ""
    if not shown:
        return None
    columns = min(CURVE_COLUMNS, len(shown))
    rows = math.ceil(len(shown) / columns)
    figure = Figure(figsize=(FIGURE_WIDTH_IN, 2.7 * rows + 0.7), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False)
    for axes in grid.flat[len(shown):]:
        axes.set_visible(False)
    for axes, run in zip(grid.flat, shown):
        accuracy_axes = axes.twinx()
        log = run.log
        axes.plot(*_series(log, "train/loss"), color=LOSS_COLOR, linewidth=1)
        axes.plot(*_series(log, "eval/loss"), "s", color=LOSS_COLOR, markersize=4)
        accuracy_axes.plot(*_series(log, "train/rewards/accuracies"), color=ACCURACY_COLOR, linewidth=1, alpha=0.8)
        accuracy_axes.plot(*_series(log, "eval/rewards/accuracies"), "D", color=ACCURACY_COLOR, markersize=4)
        accuracy_axes.set_ylim(0, 1.02)
        # Few ticks, each legible: a panel is a third of the figure's width.
        axes.xaxis.set_major_locator(MaxNLocator(4, integer=True))
        axes.yaxis.set_major_locator(MaxNLocator(5))
        accuracy_axes.yaxis.set_major_locator(MaxNLocator(5))
        axes.tick_params(labelsize=SMALLEST_FONT_PT, colors=LOSS_COLOR, axis="y")
        axes.tick_params(labelsize=SMALLEST_FONT_PT, axis="x")
        accuracy_axes.tick_params(labelsize=SMALLEST_FONT_PT, colors=ACCURACY_COLOR)
        status = run.status if run.status != "failed" else f"failed: {run.failure_kind}"
        label = labels.get(run.name) or " ".join(run.config_overrides)
        axes.set_title(f"{run.name} ({status})\n{textwrap.fill(label, 36)}", fontsize=SMALLEST_FONT_PT,
                       color=FAILED_COLOR if run.status == "failed" else "#222")
        if not log:
            axes.text(0.5, 0.5, "no steps logged", transform=axes.transAxes, ha="center", color=FAILED_COLOR)
            axes.set_xticks([])
            axes.set_yticks([])
        axes.grid(alpha=0.3)
    figure.suptitle(textwrap.fill(f"Training curves{more}: loss (blue, left axis; line: train, squares: eval) and "
                                  "preference accuracy (orange, right axis; line: train, diamonds: eval) against step",
                                  100), fontsize=9)
    return figure


def optuna_figure(study: Study) -> Figure | None:
    """The study's complete trials: objective 0 vs 1 (Pareto in red), or value by trial number."""
    complete = [t for t in study.trials if t.state == "COMPLETE" and t.values]
    if not complete:
        return None
    figure = Figure(figsize=(FIGURE_WIDTH_IN, 5), layout="constrained")
    axes = figure.add_subplot()
    if len(study.directions) >= 2:
        for trial in complete:
            axes.scatter(trial.values[0], trial.values[1], color=PARETO_COLOR if trial.best else POINT_COLOR,
                         s=50 if trial.best else 28, zorder=3)
            axes.annotate(f"#{trial.number}", (trial.values[0], trial.values[1]), xytext=(5, 4),
                          textcoords="offset points", fontsize=8)
        axes.set_xlabel(f"{study.objectives[0]} ({study.directions[0]})")
        axes.set_ylabel(f"{study.objectives[1]} ({study.directions[1]})")
        axes.set_title(f"Optuna study '{study.name}': trials, Pareto trials in red")
    else:
        numbers = [t.number for t in complete]
        values = [t.values[0] for t in complete]
        better = max if study.directions[0] == "maximize" else min
        best_so_far = [better(values[: i + 1]) for i in range(len(values))]
        axes.scatter(numbers, values, color=POINT_COLOR, zorder=3, label="trial")
        axes.step(numbers, best_so_far, where="post", color=PARETO_COLOR, label="best so far")
        axes.set_xlabel("trial number")
        axes.set_ylabel(f"{study.objectives[0]} ({study.directions[0]})")
        axes.set_title(f"Optuna study '{study.name}': value by trial")
        axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    return figure


def intermediate_figure(study: Study) -> Figure | None:
    """Each trial's reported objective by step: the curves the pruner judged; pruned trials dashed, with
    an x where they stopped."""
    reported = [t for t in study.trials if t.intermediate]
    if not reported:
        return None
    figure = Figure(figsize=(FIGURE_WIDTH_IN, 4.5), layout="constrained")
    axes = figure.add_subplot()
    for trial in reported:
        steps, values = list(trial.intermediate), list(trial.intermediate.values())
        pruned = trial.state == "PRUNED"
        line = axes.plot(steps, values, marker="o", markersize=3, linestyle="--" if pruned else "-",
                         label=f"#{trial.number}" + (" (pruned)" if pruned else ""))[0]
        if pruned:
            axes.scatter(steps[-1:], values[-1:], marker="x", s=60, color=line.get_color(), zorder=4)
    axes.set_xlabel("step")
    axes.set_ylabel(f"{study.objectives[0] if study.objectives else 'objective'} (reported)")
    axes.set_title(f"Optuna study '{study.name}': intermediate values (pruned trials dashed, x where stopped)")
    axes.grid(alpha=0.3)
    if len(reported) <= 12:
        axes.legend(fontsize=SMALLEST_FONT_PT)
    return figure
