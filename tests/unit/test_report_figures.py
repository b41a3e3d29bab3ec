"""The report's figures read at any window width (issue 48, item 6): each fits the dashboard unscaled from
1,000 px up (tests/integration/test_report_browser.py checks the page), every text of it is legible and
inside it, the Pareto figure's labels overlap nothing, and captions say only what is drawn.

The sweeps are support.reports' real run directories, read back by analysis.runs as the report reads them.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Annotation, Text
from support.reports import grid_sweep, write_completed

from dpo_sweeps.analysis import figures
from dpo_sweeps.analysis.ranking import CRITERIA, rank_sweep
from dpo_sweeps.analysis.runs import load_runs

DPI = 110  # png_bytes' default: the dashboard's PNGs
WIDEST_PX = 880  # what a 1,000 px window leaves a figure inside the page's margins


def _crowded_sweep(sweep: Path) -> Path:
    """16 configs (the most the figure labels is 20) whose speeds and accuracies lie close together."""
    job = 0
    for sharding in ("full_shard", "shard_grad_op"):
        for precision in ("fp32", "bf16"):
            for beta in (0.1, 0.12, 0.14, 0.16):
                write_completed(sweep / str(job), job, sharding, precision, beta)
                job += 1
    return sweep


def _no_failure_sweep(sweep: Path) -> Path:
    for job, (precision, beta) in enumerate([("fp32", 0.1), ("fp32", 0.5), ("bf16", 0.1), ("bf16", 0.5)]):
        write_completed(sweep / str(job), job, "full_shard", precision, beta)
    return sweep


def _ranked(sweep: Path):
    runs, _ = load_runs([sweep])
    return runs, rank_sweep(runs)


def _drawn(figure):
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.set_dpi(DPI)
    figure.draw(renderer)
    return renderer


@pytest.mark.parametrize("make_sweep", [grid_sweep, _crowded_sweep], ids=["grid", "crowded"])
def test_pareto_labels_overlap_no_other_label_no_point_and_not_the_legend(tmp_path, make_sweep):
    _, ranking = _ranked(make_sweep(tmp_path / "sweep"))
    figure = figures.pareto_figure(ranking)
    renderer = _drawn(figure)
    axes = figure.axes[0]
    labels = [t for t in axes.texts if isinstance(t, Annotation)]
    plotted = [c for c in ranking.configs if all(m in c.stats for m in CRITERIA)]
    assert {t.get_text().replace("\n", " ") for t in labels} == {c.label for c in plotted}
    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the text's own box, not its leader line
    inside = axes.get_window_extent(renderer)
    for text, box in zip(labels, boxes):
        assert inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1), text.get_text()
    for (a, box_a), (b, box_b) in combinations(zip(labels, boxes), 2):
        assert not box_a.overlaps(box_b), f"{a.get_text()!r} overlaps {b.get_text()!r}"
    legend = axes.get_legend().get_window_extent(renderer)
    assert not any(box.overlaps(legend) for box in boxes)
    markers = axes.transData.transform([(c.mean(CRITERIA[0]), c.mean(CRITERIA[1])) for c in plotted])
    radius = 4 * DPI / 72  # a marker's own half-width: 8 pt markers
    for text, box in zip(labels, boxes):
        for x, y in markers:
            assert not box.padded(-1).overlaps(box.from_extents(x - radius, y - radius, x + radius, y + radius)), (
                f"{text.get_text()!r} covers the point at {x:.0f}, {y:.0f}")


def test_every_figure_fits_the_page_unscaled_with_legible_text_inside_it(tmp_path):
    runs, ranking = _ranked(grid_sweep(tmp_path / "sweep"))
    built = {"pareto": figures.pareto_figure(ranking), "heatmap": figures.heatmap_figure(runs),
             "effects": figures.effects_figure(ranking),
             "curves": figures.curves_figure(runs, ranking.labels(), ranking)}
    for name, figure in built.items():
        assert figure is not None, name
        assert figure.get_figwidth() * DPI <= WIDEST_PX, f"{name}: wider than the page shows unscaled"
        renderer = _drawn(figure)
        page = figure.bbox
        undrawn = _undrawn_tick_labels(figure)
        texts = [t for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()
                 and t.get_window_extent(renderer).width > 0 and id(t) not in undrawn]
        assert texts, name
        for text in texts:
            assert text.get_fontsize() >= figures.SMALLEST_FONT_PT, f"{name}: {text.get_text()!r} is too small"
            box = text.get_window_extent(renderer)
            assert box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1 and box.y1 <= page.y1 + 1, (
                f"{name}: {text.get_text()!r} runs off the figure")


def _undrawn_tick_labels(figure) -> set[int]:
    """The tick labels matplotlib keeps past an axis' limits and does not draw."""
    undrawn = set()
    for axes in figure.axes:
        for axis in (axes.xaxis, axes.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                if not low - 1e-9 * abs(high - low) <= tick.get_loc() <= high + 1e-9 * abs(high - low):
                    undrawn |= {id(tick.label1), id(tick.label2)}
    return undrawn


def test_the_effects_caption_names_failures_only_where_a_run_failed(tmp_path):
    _, with_failure = _ranked(grid_sweep(tmp_path / "grid"))  # an OOM run among them
    _, without = _ranked(_no_failure_sweep(tmp_path / "clean"))
    failed = figures.effects_figure(with_failure)
    assert "failed runs" in failed.get_suptitle()
    clean = figures.effects_figure(without)
    assert "fail" not in clean.get_suptitle()
    # The means are drawn in their own colour, never the failures' red.
    means = [line for axes in clean.axes for line in axes.get_lines() if line.get_label() == "mean"]
    assert means and {line.get_color() for line in means} == {figures.MEAN_COLOR} != {figures.FAILED_COLOR}
