"""Predicted against measured step time, run by run (dpo_sweeps/cost/: summary.json's
perf/step_time_predicted_s with its interval beside perf/step_time_s): a scatter, the error of each run, and
their median, so a user sees at once how far to trust the predictions on their cluster."""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass

from matplotlib.figure import Figure

from dpo_sweeps.analysis.runs import Run

PREDICTED = "perf/step_time_predicted_s"
MEASURED = "perf/step_time_s"


@dataclass(frozen=True)
class PredictedStep:
    run: str
    predicted_s: float
    low_s: float
    high_s: float
    measured_s: float
    profile: str
    worst_s: float | None = None  # every row at data.max_length (the predicted one is from the data's lengths)
    provisional: bool = False  # the prediction rested on a timing taken on a busy machine

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def inside(self) -> bool:
        return self.low_s <= self.measured_s <= self.high_s


def predicted_steps(runs: list[Run]) -> list[PredictedStep]:
    """Every run that has both a predicted (with its interval) and a measured step time."""
    out = []
    for run in runs:
        values = [run.metric(k) for k in (PREDICTED, f"{PREDICTED[:-2]}_low_s", f"{PREDICTED[:-2]}_high_s", MEASURED)]
        if all(math.isfinite(v) and v > 0 for v in values):
            worst = run.metrics.get("perf/step_time_predicted_worst_s")
            out.append(PredictedStep(run.name, *values, str(run.metrics.get("perf/step_time_predicted_profile") or ""),
                                     worst if isinstance(worst, int | float) else None,
                                     bool(run.metrics.get("perf/step_time_predicted_provisional"))))
    return out


def summary_line(steps: list[PredictedStep]) -> str | None:
    if not steps:
        return None
    inside = sum(s.inside for s in steps)
    return (f"predicted step time: median absolute error {100 * statistics.median(abs(s.error) for s in steps):.0f}% "
            f"over {len(steps)} runs, worst {100 * max(abs(s.error) for s in steps):.0f}%, {inside} of {len(steps)} "
            "measured inside the predicted interval")


def terminal_lines(steps: list[PredictedStep]) -> list[str]:
    if not steps:
        return []
    lines = ["Predicted vs measured step time (s):"]
    for s in steps:
        worst = f" (worst case {s.worst_s:.3g})" if s.worst_s is not None else ""
        flag = ", on a provisional timing (a busy machine)" if s.provisional else ""
        lines.append(f"  {s.run}: predicted {s.predicted_s:.3g} [{s.low_s:.3g}-{s.high_s:.3g}]{worst} on {s.profile}"
                     f"{flag}, measured {s.measured_s:.3g} ({100 * s.error:+.0f}%)")
    lines.append(summary_line(steps))
    return lines


def predicted_figure(steps: list[PredictedStep]) -> Figure | None:
    """Log-log scatter of measured against predicted step time, the predicted interval as an error bar,
    the diagonal where they agree."""
    if not steps:
        return None
    figure = Figure(figsize=(5.5, 4.5))
    ax = figure.subplots()
    predicted = [s.predicted_s for s in steps]
    measured = [s.measured_s for s in steps]
    errors = [[s.predicted_s - s.low_s for s in steps], [s.high_s - s.predicted_s for s in steps]]
    ax.errorbar(predicted, measured, xerr=errors, fmt="o", color="#5b6f95", ecolor="#9aa7c2", capsize=3)
    low, high = min(predicted + measured + [s.low_s for s in steps]), max(predicted + measured + [s.high_s for s in steps])
    ax.plot([low / 1.3, high * 1.3], [low / 1.3, high * 1.3], color="#999999", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted step time, s (interval)")
    ax.set_ylabel("measured step time, s")
    ax.set_title(summary_line(steps).replace(", worst", "\nworst"), fontsize=8)
    figure.tight_layout()
    return figure


def html_section(steps: list[PredictedStep], image_html: str) -> str:
    if not steps:
        return ""
    rows = "".join(f"<tr><td>{html.escape(s.run)}</td><td>{s.predicted_s:.3g} [{s.low_s:.3g}-{s.high_s:.3g}]</td>"
                   f"<td>{s.measured_s:.3g}</td><td>{100 * s.error:+.0f}%</td></tr>" for s in steps)
    return (f'<section id="predicted"><h2>Predicted vs measured step time</h2><p>{html.escape(summary_line(steps))}'
            f"</p>{image_html}<table><tr><th>run</th><th>predicted s [interval]</th><th>measured s</th>"
            f"<th>error</th></tr>{rows}</table></section>")
