"""Rank a sweep's runs by speed per memory and preference accuracy; write its dashboard.

    python analysis/report.py multirun/2026-11-30/12-00-00          # in a checkout
    dpo-sweeps-report multirun/2026-11-30/* --out reports/nov30     # any install (console script)
    dpo-sweeps-report multirun/2026-11-30/12-00-00 --to mlflow http://127.0.0.1:5000   # and upload the runs

Reads every run's summary.json and metrics.jsonl under the given directories (completed,
failed and still-running runs alike) and writes, into `<sweep>/report/` or `--out`:
ranking.csv (one row per config), runs.csv (one row per run), loss_metrics.csv (each loss's
own metrics, one row per config and metric), report.html (the offline dashboard) and the
dashboard's figures as PNG. Prints the ranking to the terminal. When the sweep's jobs logged to MLflow
(tracking.backends), report.html and ranking.csv are logged to the sweep's parent run there too.
`--to mlflow URI` or `--to tensorboard DIR` first uploads the finished runs (docs/trackers.md).

Exit status: 0 when the report is written, 2 when a directory holds no runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a script (`python analysis/report.py`): import `analysis` from the repository
    # root, not this folder, whose module names (tables, figures) could shadow others.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))

from dpo_sweeps.analysis import dashboard, figures, sweep_definition, tables  # noqa: E402
from dpo_sweeps.analysis.loss_metrics import loss_metric_rows  # noqa: E402
from dpo_sweeps.analysis.optuna_study import load_studies, study_figures  # noqa: E402
from dpo_sweeps.analysis.predicted_cost import html_section, predicted_figure, predicted_steps, terminal_lines  # noqa: E402
from dpo_sweeps.analysis.ranking import rank_sweep  # noqa: E402
from dpo_sweeps.analysis.recommendation import load_recommendations  # noqa: E402
from dpo_sweeps.analysis.runs import NoRunsError, load_runs  # noqa: E402
from dpo_sweeps.analysis.sample_replies import best_samples, samples_html, samples_lines  # noqa: E402


def default_out_dir(sources: list[Path]) -> Path:
    """`<sweep>/report`; for several sweeps, `report/` in the folder they share."""
    if len(sources) == 1:
        return sources[0] / "report"
    return Path(os.path.commonpath([s.resolve() for s in sources])) / "report"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(  # prog: as invoked (analysis/report.py, dpo-sweeps-report)
        description="Rank a DPO sweep's runs by speed per memory and preference accuracy; "
                    "write a CSV ranking, PNG figures and an offline HTML dashboard.")
    parser.add_argument("sweep_dirs", nargs="+", type=Path, metavar="SWEEP_DIR",
                        help="a Hydra sweep directory (multirun/DATE/TIME), an Optuna sweep, a folder of "
                             "sweeps or one run's directory")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the report (default: SWEEP_DIR/report, or report/ in the "
                             "folder shared by several SWEEP_DIRs)")
    parser.add_argument("--to", nargs=2, metavar=("TRACKER", "WHERE"), default=None,
                        help="upload the finished runs first: `mlflow URI` (an MLflow server) or `tensorboard DIR`; "
                             "uploading again adds nothing")
    return parser


def send_to_trackers(args: argparse.Namespace, written: list[Path]) -> list[str]:
    """--to's upload, then the report's files to the sweep's MLflow parent run; the lines to print."""
    from dpo_sweeps.analysis.upload import upload

    lines = []
    if args.to:
        kind, where = args.to
        done = upload(args.sweep_dirs, kind, where)
        lines.append(f"Uploaded {done.runs} runs to {kind} at {where}: {done.points} new metric points"
                     + (f"; not finished, left out: {', '.join(done.skipped)}" if done.skipped else "")
                     + (f"; failed (see the warnings): {', '.join(done.failed)}" if done.failed else ""))
    if len(args.sweep_dirs) == 1:
        from dpo_sweeps.tracking.backend import missing_libraries

        if not missing_libraries(["mlflow"]):
            from dpo_sweeps.tracking.mlflow_backend import log_report

            files = [p for p in written if p.name in ("report.html", "ranking.csv")]
            try:
                parent = log_report(args.sweep_dirs[0], files)
            except Exception as exc:  # noqa: BLE001 (the report is written; the tracker is extra)
                lines.append(f"warning: the report could not be logged to MLflow: {type(exc).__name__}: {exc}")
            else:
                if parent:
                    lines.append(f"Logged report.html and ranking.csv to the sweep's MLflow run {parent}")
    return lines


@dataclass
class ReportResult:
    """What a report wrote and found: the terminal text, the files (report.html last) and one record per
    config, ranking.csv's row (tied_with_best, diff_vs_best, p_vs_best_adjusted, rank_with_ties, ...)."""

    text: str
    files: list[Path]
    configs: list[dict[str, Any]] = field(default_factory=list)


def write_report(sources: list[Path], out: Path | None = None) -> tuple[str, list[Path]]:
    """Read, rank and write everything; returns the terminal text and the files written."""
    result = build_report(sources, out)
    return result.text, result.files


def build_report(sources: list[Path], out: Path | None = None) -> ReportResult:
    """Read, rank and write everything (as `write_report`), and return each config's row too."""
    runs, sweep_dirs = load_runs(sources)
    not_started = sweep_definition.not_started(sweep_dirs, Counter(run.sweep for run in runs))
    ranking = rank_sweep(runs)
    studies = load_studies(sweep_dirs, runs)
    recommendations = load_recommendations(sweep_dirs)
    out = out or default_out_dir(sources)
    out.mkdir(parents=True, exist_ok=True)

    steps = predicted_steps(runs)
    built = {
        "pareto": figures.pareto_figure(ranking),
        "predicted": predicted_figure(steps),
        "heatmap": figures.heatmap_figure(runs),
        "effects": figures.effects_figure(ranking),
        "curves": figures.curves_figure(runs, ranking.labels(), ranking),
        **{f"optuna-{i}": figures.optuna_figure(study) for i, study in enumerate(studies)},
        **{f"optuna-{i}-intermediate": figures.intermediate_figure(study) for i, study in enumerate(studies)},
        **{f"optuna-{i}-{name}": figure for i, study in enumerate(studies)
           for name, figure in study_figures(study).items()},
    }
    pngs: dict[str, bytes | None] = {}
    written: list[Path] = []
    for name, figure in built.items():
        path = out / f"{name}.png"
        pngs[name] = figures.png_bytes(figure) if figure is not None else None
        if pngs[name]:
            path.write_bytes(pngs[name])
            written.append(path)
        elif path.exists():
            path.unlink()  # a figure from an earlier report that has nothing to show now

    written.append(tables.write_csv(out / "ranking.csv", tables.config_columns(ranking), tables.config_rows(ranking)))
    written.append(tables.write_csv(out / "runs.csv", tables.run_columns(ranking), tables.run_rows(runs, ranking)))
    written.append(tables.write_csv(out / "loss_metrics.csv", tables.LOSS_METRIC_COLUMNS,
                                    tables.loss_metric_csv_rows(loss_metric_rows(ranking))))
    generated = datetime.now().astimezone().isoformat(timespec="seconds")
    samples = best_samples(runs)
    page = dashboard.render([str(s) for s in sources], runs, ranking, studies, pngs, generated, not_started,
                            recommendations, samples_section=samples_html(samples) + html_section(
                                steps, dashboard.image_html(pngs.get("predicted"), "Predicted vs measured step time")))
    html_path = out / "report.html"
    html_path.write_text(page, encoding="utf-8")
    written.append(html_path)
    text = tables.terminal_report(sources, runs, ranking, studies, not_started, recommendations)
    extra = [block for block in ("\n".join(samples_lines(samples)) if samples else "", "\n".join(terminal_lines(steps)))
             if block]
    return ReportResult("\n\n".join([text, *extra]), written, tables.config_rows(ranking))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.to:
        from dpo_sweeps.analysis.upload import UploadRefused, check_target

        try:
            check_target(*args.to)
        except UploadRefused as error:
            print(f"report.py: {error}", file=sys.stderr)
            return 2
    try:
        text, written = write_report(args.sweep_dirs, args.out)
    except (NoRunsError, FileNotFoundError) as error:
        print(f"report.py: {error}", file=sys.stderr)
        return 2
    print(text)
    for line in send_to_trackers(args, written):
        print(line)
    print(f"\nWrote {len(written)} files to {written[-1].parent}: {', '.join(p.name for p in written)}")
    print(f"Dashboard: {written[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
