"""The report as one self-contained HTML page: figures inlined as base64 PNG, inline CSS and
a few lines of inline JavaScript for sorting and filtering tables. It fetches nothing, so
it opens offline and can be mailed or archived as a single file.

Once its script has run, the page sets `<html data-dashboard="ready">`; tests wait for it.
"""

from __future__ import annotations

import base64
import html
import math
from typing import Any

import yaml

from dpo_sweeps.analysis.loss_metrics import loss_metric_rows
from dpo_sweeps.analysis.optuna_study import Study
from dpo_sweeps.analysis.ranking import CRITERIA, Ranking
from dpo_sweeps.analysis.recommendation import Recommendation, recommendation_html
from dpo_sweeps.analysis.runs import PREFERENCE_ACCURACY, Run
from dpo_sweeps.analysis.tables import (
    PROBES_NO_ACCURACY,
    comparison_text,
    config_rows,
    cost_text,
    format_failures,
    format_number,
    format_stat,
    missing_text,
    quality_lines,
    run_columns,
    run_rows,
    status_line,
)

STYLE = """
:root { --ink:#1f2430; --muted:#5d6576; --line:#dde1e8; --accent:#d1495b; --bg:#f6f7f9; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif; color:var(--ink);
       background:var(--bg); }
header { background:#1f2430; color:#fff; padding:18px 28px; }
header h1 { margin:0 0 4px; font-size:22px; }
header p { margin:2px 0; color:#c9cfdb; font-size:13px; }
main { padding:8px 28px 40px; max-width:1500px; }
section { background:#fff; border:1px solid var(--line); border-radius:8px; padding:14px 18px; margin:16px 0; }
h2 { font-size:17px; margin:0 0 10px; }
.cards { display:grid; grid-template-columns:repeat(auto-fit,minmax(280px,1fr)); gap:12px; background:none;
         border:none; padding:0; }
.card { background:#fff; border:1px solid var(--line); border-left:4px solid var(--accent); border-radius:8px;
        padding:12px 16px; }
.card h3 { margin:0 0 6px; font-size:12px; text-transform:uppercase; letter-spacing:.04em; color:var(--muted); }
.card .config { font-family:ui-monospace,Menlo,Consolas,monospace; font-size:13px; word-break:break-word; }
.card .value { font-size:20px; font-weight:600; margin-top:4px; }
.card ol { margin:0; padding-left:20px; font-family:ui-monospace,Menlo,Consolas,monospace; font-size:12.5px; }
.note { padding:8px 12px; border-radius:6px; margin:6px 0; background:#eef4ff; border:1px solid #c9dafc; }
.note.close { background:#fff5e6; border-color:#f3c77a; }
img { max-width:100%; height:auto; display:block; margin:8px 0; }
.scroll { overflow-x:auto; max-height:640px; overflow-y:auto; border:1px solid var(--line); border-radius:6px;
          scrollbar-width:auto; scrollbar-color:#9aa3b2 #eef0f4; }
/* A table wider than the page scrolls sideways, and says so: overlay scrollbars show none until touched.
   The shade on the right edge marks the columns still to the right. */
.table-frame { position:relative; }
.table-frame.more-right::after { content:""; position:absolute; top:0; right:0; bottom:0; width:28px;
          pointer-events:none; border-radius:0 6px 6px 0;
          background:linear-gradient(to left, rgba(31,36,48,.22), rgba(31,36,48,0)); }
.scroll-hint { margin:0 0 6px; font-size:12.5px; color:var(--muted); }
table { border-collapse:separate; border-spacing:0; font-size:12.5px; width:100%; }
th, td { padding:5px 8px; border-bottom:1px solid var(--line); text-align:right; white-space:nowrap; }
/* Headers wrap at their slashes and brackets (<wbr>), so long metric names do not widen every column. */
thead th { white-space:normal; min-width:4.5em; vertical-align:bottom; }
/* The first column names the row: it stays in view while the table scrolls sideways. */
tbody tr { background:#fff; }
tbody td:first-child, thead th:first-child { position:sticky; left:0; box-shadow:1px 0 0 var(--line); }
tbody td:first-child { background:inherit; z-index:1; }
thead th:first-child { z-index:2; }
td.text, th.text { text-align:left; }
td.config { font-family:ui-monospace,Menlo,Consolas,monospace; text-align:left; }
thead th { position:sticky; top:0; background:#eef0f4; cursor:pointer; user-select:none; z-index:1; }
thead th:hover { background:#e1e5ec; }
thead th[aria-sort=ascending]::after { content:" \\25B2"; font-size:10px; }
thead th[aria-sort=descending]::after { content:" \\25BC"; font-size:10px; }
tbody tr:nth-child(even) { background:#fafbfc; }
tr.pareto td.config { font-weight:600; }
tr.tied td.config { text-decoration:underline dotted; }
tr.failed { background:#fdecec !important; }
tr.failed td.status { color:#b3261e; font-weight:600; }
tr.pruned { background:#f3f0e6 !important; }
tr.pruned td.status { color:#7a5c00; font-weight:600; }
tr.skipped { background:#eef1f6 !important; color:#555; }
tr.skipped td.status { color:#3b5b8c; font-weight:600; }
tr.pending { color:var(--muted); font-style:italic; }
.filter { margin:0 0 8px; padding:5px 9px; width:320px; max-width:100%; border:1px solid var(--line);
          border-radius:6px; font:inherit; }
.muted { color:var(--muted); }
"""

SCRIPT = """
(function () {
  function key(cell) {
    var raw = cell.getAttribute("data-value");
    var text = raw !== null ? raw : cell.textContent.trim();
    if (text === "") return null;
    var number = Number(text);
    return isNaN(number) ? text.toLowerCase() : number;
  }
  function compare(a, b) {
    if (a === null || b === null) return (a === null) - (b === null);
    if (typeof a !== typeof b) return typeof a === "number" ? -1 : 1;
    return a < b ? -1 : a > b ? 1 : 0;
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
    headers.forEach(function (header, index) {
      header.tabIndex = 0;
      function sort() {
        var ascending = header.getAttribute("aria-sort") !== "ascending";
        headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
        header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (x, y) {
          var a = key(x.cells[index]), b = key(y.cells[index]);
          if (a === null || b === null) return compare(a, b);  /* empty cells last either way */
          return ascending ? compare(a, b) : compare(b, a);
        });
        rows.forEach(function (row) { body.appendChild(row); });
      }
      header.addEventListener("click", sort);
      header.addEventListener("keydown", function (event) { if (event.key === "Enter") sort(); });
    });
  });
  document.querySelectorAll("input.filter").forEach(function (input) {
    var table = document.getElementById(input.getAttribute("data-table"));
    input.addEventListener("input", function () {
      var query = input.value.trim().toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        row.hidden = query !== "" && row.textContent.toLowerCase().indexOf(query) === -1;
      });
    });
  });
  document.querySelectorAll(".table-frame").forEach(function (frame) {
    var box = frame.querySelector(".scroll");
    var hint = frame.previousElementSibling;
    function mark() {
      var overflows = box.scrollWidth > box.clientWidth + 1;
      frame.classList.toggle("more-right", box.scrollWidth - box.clientWidth - box.scrollLeft > 1);
      hint.hidden = !overflows;
      if (overflows) {
        var columns = box.querySelector("thead tr").cells.length;
        hint.textContent = "Wider than the window: scroll the table sideways (its scrollbar, shift + wheel or a " +
          "swipe) for all " + columns + " columns; the first stays in view.";
      }
    }
    box.addEventListener("scroll", mark);
    window.addEventListener("resize", mark);
    mark();
  });
  document.documentElement.setAttribute("data-dashboard", "ready");
})();
"""


def _escape(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _cell(value: Any, display: str | None = None, css: str = "") -> str:
    """A table cell whose data-value keeps the exact number for sorting and checking."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if is_number and isinstance(value, float) and not math.isfinite(value):
        value, is_number = None, False
    shown = display if display is not None else (format_number(value) if is_number else _escape(value))
    data = f' data-value="{value!r}"' if is_number else ""
    css = css or ("" if is_number or value is None else "text")
    return f'<td class="{css}"{data}>{shown}</td>'


# A table shows at most this many rows (the first: configs best first, runs in order); the CSV beside
# the report has them all. A page of 10,000 rows is tens of MB and slow to open.
MAX_TABLE_ROWS = 1000


def _table(table_id: str, header: list[str], rows: list[tuple[str, list[str]]], placeholder: str,
           csv_name: str = "") -> str:
    note = ""
    if len(rows) > MAX_TABLE_ROWS:
        note = (f'<p class="note">The first {MAX_TABLE_ROWS:,} of {len(rows):,} rows (the filter searches these); '
                f'all of them are in {_escape(csv_name)}.</p>')
        rows = rows[:MAX_TABLE_ROWS]
    # Numbers align right, text left: a column holding any number is a number column.
    numeric = [any('data-value="' in cells[i] for _, cells in rows) for i in range(len(header))]
    head = "".join(f'<th scope="col" class="{"" if n else "text"}">{_breakable(h)}</th>' for h, n in zip(header, numeric))
    body = "".join(f'<tr class="{css}">{"".join(cells)}</tr>' for css, cells in rows)
    return (f'{note}<input class="filter" type="search" data-table="{table_id}" placeholder="{placeholder}">'
            f'<p class="scroll-hint" hidden></p><div class="table-frame"><div class="scroll">'
            f'<table id="{table_id}" class="sortable"><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table></div></div>')


def _breakable(header: str) -> str:
    """A column header that may wrap after each / ( or space: `eval/rewards/accuracies` takes three short
    lines, not one long one (the text itself, which sorting and tests read, is unchanged)."""
    escaped = _escape(header)
    for mark in ("/", "("):
        escaped = escaped.replace(mark, f"{mark}<wbr>")
    return escaped


def image_html(png: bytes | None, alt: str, why: str = "nothing to plot yet") -> str:
    """An embedded PNG, or why there is none."""
    return _image(png, alt, why)


def _image(png: bytes | None, alt: str, why: str = "nothing to plot yet") -> str:
    if not png:
        return f'<p class="muted">No {alt.lower()}: {_escape(why)}.</p>'
    return f'<img alt="{_escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _cards(ranking: Ranking) -> str:
    cards = []
    for metric in CRITERIA:
        ranked = ranking.by[metric]
        if ranked:
            best, comparison = ranked[0], ranking.comparisons.get(metric)
            tie = f" · tied with {comparison.tied - 1} other(s)" if comparison and comparison.tied > 1 else ""
            if metric == PREFERENCE_ACCURACY and len(ranking.tied_with_best()) > 1 and ranking.quality.tests:
                tie = f" · tied with {len(ranking.tied_with_best()) - 1} other(s) (paired tests)"
            body = (f'<div class="config">{_escape(best.label)}</div><div class="value">'
                    f'{_escape(format_stat(best.stats[metric]))}</div>'
                    f'<div class="muted">n={best.stats[metric].n}{tie}</div>')
        else:
            body = f'<div class="muted">{_escape(missing_text(ranking, metric))}</div>'
        cards.append(f'<div class="card" id="best-{metric.split("/")[-1]}"><h3>Best by {_escape(metric)}</h3>{body}</div>')
    items = "".join(
        f"<li>{_escape(c.label)} <span class='muted'>({' · '.join(format_stat(c.stats[m]) for m in CRITERIA)})</span></li>"
        for c in ranking.pareto)
    cards.append(f'<div class="card" id="pareto-set"><h3>Pareto set ({len(ranking.pareto)})</h3><ol>{items}</ol></div>')
    return f'<section class="cards">{"".join(cards)}</section>'


def _difference(row: dict[str, Any]) -> str:
    """diff_vs_best in points with its 95% interval: '-2.1 [-4.0, -0.2]'."""
    diff, low, high = row["diff_vs_best"], row["diff_vs_best_ci95_low"], row["diff_vs_best_ci95_high"]
    if not isinstance(diff, float) or not math.isfinite(diff):
        return ""
    interval = f" [{100 * low:+.1f}, {100 * high:+.1f}]" if math.isfinite(low) and math.isfinite(high) else ""
    return f"{100 * diff:+.1f}{interval}"


def _configs_table(ranking: Ranking) -> str:
    header = ["config", *[f"rank({m})" for m in CRITERIA], "pareto", "tied_with_best", "rank_with_ties",
              "diff_vs_best (points, 95%)", "p_vs_best_adjusted", "status", "n", "failures", *ranking.axes,
              *ranking.metrics, "runs"]
    rows = []
    for config, row in zip(ranking.configs, config_rows(ranking)):
        cells = [_cell(row["config"], css="config")]
        cells += [_cell(row[f"rank({m})"]) for m in CRITERIA]
        cells.append(f'<td data-value="{int(row["pareto"])}">{"★" if row["pareto"] else ""}</td>')
        tied = row["tied_with_best"]
        cells.append(f'<td data-value="{int(bool(tied))}">{"=" if tied else ""}</td>' if tied is not None else "<td></td>")
        cells += [_cell(row["rank_with_ties"]), _cell(row["diff_vs_best"], _escape(_difference(row))),
                  _cell(row["p_vs_best_adjusted"])]
        cells += [_cell(row["status"], css="text status"), _cell(row["n"]), _cell(row["failures"])]
        # Settings read as typed in the overrides (0.1, not 0.1000).
        cells += [_cell(row[axis], _escape(row[axis])) for axis in ranking.axes]
        # Sorted by the mean (data-value), shown as mean ± std.
        cells += [_cell(row[m], _escape(format_stat(config.stats.get(m)))) for m in ranking.metrics]
        cells.append(_cell(row["runs"]))
        css = " ".join(filter(None, ["pareto" if config.pareto else "", "tied" if row["tied_with_best"] else "",
                                     "failed" if not config.completed else ""]))
        rows.append((css, cells))
    return _table("configs-table", header, rows, "Filter configs (e.g. bf16, oom)", "ranking.csv")


def _runs_table(runs: list[Run], ranking: Ranking) -> str:
    columns = run_columns(ranking)
    rows = []
    for run, row in zip(runs, run_rows(runs, ranking)):
        cells = [_cell(row[c], css="config" if c == "config" else ("text status" if c == "status" else ""))
                 for c in columns]
        rows.append((run.status, cells))
    return _table("runs-table", columns, rows, "Filter runs (e.g. failed, full_shard)", "runs.csv")


def _loss_metrics_section(ranking: Ranking) -> str:
    """Each loss's own metrics (absent when no loss in the sweep logs any)."""
    rows = [("", [_cell(r.config, css="config"), _cell(r.loss, css="text"), _cell(r.metric, css="text"),
                  _cell(r.stat.mean, _escape(format_stat(r.stat))), _cell(r.stat.n)])
            for r in loss_metric_rows(ranking)]
    if not rows:
        return ""
    return ('<section id="loss-metrics"><h2>Each loss\'s own metrics</h2><p class="muted">Eval metrics a loss logs '
            'beyond loss, rewards/* and logps/* (INTERFACE.md), mean ± std over a config\'s completed seeds.</p>'
            f'{_table("loss-metrics-table", ["config", "loss.name", "metric", "value", "n"], rows, "Filter (e.g. orpo)")}'
            '</section>')


def _study_section(study: Study, png: bytes | None, index: int, intermediate_png: bytes | None = None,
                   optuna_pngs: tuple[bytes | None, bytes | None] = (None, None)) -> str:
    if study.problem:
        return f'<section id="optuna-{index}"><h2>Optuna study</h2><p class="note close">{_escape(study.problem)}</p></section>'
    objectives = [f"{o} ({d})" for o, d in zip(study.objectives, study.directions)]
    header = ["trial", "state", "best" if len(study.directions) == 1 else "pareto", *objectives, "params", "run"]
    rows = []
    for trial in study.trials:
        values = list(trial.values or ()) + [None] * (len(objectives) - len(trial.values or ()))
        cells = [_cell(trial.number), _cell(trial.state, css="text status"),
                 f'<td data-value="{int(trial.best)}">{"★" if trial.best else ""}</td>']
        cells += [_cell(v) for v in values]
        cells += [_cell(" ".join(f"{k}={v}" for k, v in trial.params.items()), css="config"), _cell(trial.run)]
        css = "pareto" if trial.best else {"FAIL": "failed", "PRUNED": "pruned"}.get(trial.state, "")
        rows.append((css, cells))
    if study.results is None:
        results = '<p class="muted">No optimization_results.yaml yet: the sweep is still running.</p>'
    else:
        results = (f'<details><summary>optimization_results.yaml (the sweeper\'s verdict)</summary><pre>'
                   f'{_escape(yaml.safe_dump(study.results, sort_keys=False))}</pre></details>')
    return (f'<section id="optuna-{index}"><h2>Optuna study “{_escape(study.name)}”</h2>'
            f'<p class="muted">{_escape(study.sweep)} · {len(study.trials)} trials · objectives: '
            f'{_escape(", ".join(objectives) or "?")}</p>{results}{_image(png, "Optuna trials")}'
            f'{_image(intermediate_png, "Optuna intermediate values", "no trial reported any (trials report each evaluation when the sweep has a pruner)")}'
            f'{_image(optuna_pngs[0], "Optuna optimization history")}'
            f'{_image(optuna_pngs[1], "Optuna parameter importances", "too few completed trials to rank the parameters")}'
            f'{_table(f"trials-{index}", header, rows, "Filter trials")}</section>')


def render(sources: list[str], runs: list[Run], ranking: Ranking, studies: list[Study],
           figures: dict[str, bytes | None], generated: str, not_started: int | None = None,
           recommendations: list[Recommendation] | None = None, samples_section: str = "") -> str:
    """The whole dashboard page. `figures`: pareto, heatmap, effects, curves, optuna-<i> PNGs;
    `samples_section`: the best run's replies before and after training (analysis/sample_replies.py)."""
    notes = "".join(
        f'<p class="note{" close" if c.close else ""}">{_escape(comparison_text(c))}</p>'
        for c in ranking.comparisons.values())
    failed = [c for c in ranking.configs if not c.completed]
    failed_note = (f'<p class="muted">Every run of {len(failed)} config(s) failed; they are listed with their '
                   f'failure kind: {_escape("; ".join(f"{c.label}: {format_failures(c.failures)}" for c in failed))}</p>'
                   if failed else "")
    pareto_why = PROBES_NO_ACCURACY if ranking.probes else "nothing to plot yet"
    ties = "".join(f'<p class="{"note" if i == 0 else "muted"}">{_escape(line.strip())}</p>'
                   for i, line in enumerate(quality_lines(ranking)))
    ties_section = (f'<section id="ties"><h2>Accuracy with ties</h2>{ties}<p class="muted">Tied: not significantly '
                    'worse than the best (Holm-adjusted p >= 0.05); rank_with_ties = 1 + the configs significantly '
                    'better; the Pareto figure\'s accuracy bars are 95% intervals and its rings mark the tied set '
                    '(docs/report.md).</p></section>') if ties else ""
    studies_html = "".join(_study_section(s, figures.get(f"optuna-{i}"), i, figures.get(f"optuna-{i}-intermediate"),
                                          (figures.get(f"optuna-{i}-history"), figures.get(f"optuna-{i}-importances")))
                           for i, s in enumerate(studies))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>DPO sweep report</title><link rel="icon" href="data:,"><style>{STYLE}</style></head>
<body><header><h1>DPO sweep report</h1><p>{_escape(" · ".join(sources))}</p>
<p id="status-line">{_escape(status_line(runs, not_started))}</p><p id="cost">{_escape(cost_text(runs))}</p><p>Generated {_escape(generated)}</p></header>
<main>{"".join(recommendation_html(r, _escape) for r in recommendations or [])}{_cards(ranking)}{notes}{ties_section}
<section id="pareto"><h2>Pareto front: speed per memory vs preference accuracy</h2>{_image(figures.get("pareto"), "Pareto scatter", pareto_why)}</section>
<section id="configs"><h2>Configs ({len(ranking.configs)})</h2><p class="muted">Click a column to sort; values are
mean ± std over a config's completed seeds (n); ★ marks the Pareto set, = the configs tied with the best accuracy.</p>{failed_note}{_configs_table(ranking)}</section>
<section id="effects"><h2>Effects of the swept settings</h2>{_image(figures.get("heatmap"), "Sharding × precision heatmap")}
{_image(figures.get("effects"), "Effects per setting")}</section>
{_loss_metrics_section(ranking)}{studies_html}{samples_section}
<section id="runs"><h2>Runs ({len(runs)})</h2><p class="muted">Every run directory, failed and pending ones
included: a failure such as an OOM is a result.</p>{_runs_table(runs, ranking)}</section>
<section id="curves"><h2>Training curves</h2>{_image(figures.get("curves"), "Training curves")}</section>
</main><script>{SCRIPT}</script></body></html>
"""
