"""analysis/report.py on real sweep directories written by support.reports.

Every expected number is computed here, straight from the summary.json files, without the
analysis package: the report must agree with the runs it reads.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import statistics
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from support.reports import grid_sweep, optuna_sweep, resolved_config, write_completed, write_run

from dpo_sweeps.analysis.report import main

SPM, ACCURACY = "perf/speed_per_memory", "eval/rewards/accuracies"


# ---- independent reading of the fixtures -------------------------------------------------

def summaries(sweep: Path) -> dict[str, dict]:
    """Run folder name -> parsed summary.json, for every run that has one."""
    return {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/summary.json")}


def config_of(summary: dict) -> str:
    """A config's identity: its overrides without the seed one."""
    return " ".join(o for o in summary["overrides"] if not o.startswith("train.seed="))


def expected_configs(sweep: Path) -> dict[str, dict]:
    """Config -> {runs, n, mean and stdev of both criteria} over completed runs."""
    grouped: dict[str, dict] = {}
    for name, summary in summaries(sweep).items():
        entry = grouped.setdefault(config_of(summary), {"runs": [], SPM: [], ACCURACY: [], "failed": []})
        entry["runs"].append(name)
        if summary["status"] == "completed":
            entry[SPM].append(summary["metrics"][SPM])
            entry[ACCURACY].append(summary["metrics"][ACCURACY])
        else:
            entry["failed"].append(summary["failure"]["kind"])
    for entry in grouped.values():
        entry["n"] = len(entry[SPM])
        for metric in (SPM, ACCURACY):
            values = entry[metric]
            entry[f"mean {metric}"] = statistics.fmean(values) if values else None
            entry[f"std {metric}"] = statistics.stdev(values) if len(values) > 1 else None
    return grouped


def brute_force_pareto(configs: dict[str, dict]) -> set[str]:
    points = {k: (v[f"mean {SPM}"], v[f"mean {ACCURACY}"]) for k, v in configs.items() if v["n"]}
    return {k for k, (x, y) in points.items()
            if not any(ox >= x and oy >= y and (ox, oy) != (x, y) for ox, oy in points.values())}


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def row_config(row: dict[str, str], sweep: Path) -> str:
    """The config of a ranking.csv row, found through the runs it lists."""
    first_run = row["runs"].split()[0].split("/")[-1]
    return config_of(summaries(sweep)[first_run])


class TableCells(HTMLParser):
    """The (data-value or text) cells of each row of one table of the dashboard."""

    def __init__(self, table_id: str):
        super().__init__()
        self.table_id, self.inside, self.header, self.rows = table_id, False, [], []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id") == self.table_id:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self._cell = [attrs["data-value"]] if "data-value" in attrs else []
            self._keep_text = "data-value" not in attrs

    def handle_data(self, data):
        if self._cell is not None and self._keep_text:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if self.inside and tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table" and self.inside:
            self.inside = False


def html_table(page: Path, table_id: str) -> list[dict[str, str]]:
    parser = TableCells(table_id)
    parser.feed(page.read_text())
    header, *rows = parser.rows
    return [dict(zip(header, row)) for row in rows]


@pytest.fixture(scope="module")
def reported_grid(tmp_path_factory) -> tuple[Path, str]:
    """The grid sweep reported once, and what the report printed, for tests that only read."""
    sweep = grid_sweep(tmp_path_factory.mktemp("reported") / "multirun" / "2026-11-30" / "12-00-00")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([str(sweep)]) == 0
    return sweep, printed.getvalue()


# ---- rankings, aggregates, Pareto --------------------------------------------------------

def test_ranking_csv_means_stds_and_counts_match_the_summary_files(reported_grid):
    grid, _ = reported_grid
    expected = expected_configs(grid)
    rows = read_csv(grid / "report" / "ranking.csv")
    assert len(rows) == len(expected)
    for row in rows:
        want = expected[row_config(row, grid)]
        assert int(row["n"]) == want["n"]
        for metric in (SPM, ACCURACY):
            if want["n"]:
                assert float(row[metric]) == pytest.approx(want[f"mean {metric}"], rel=1e-12)
            else:
                assert row[metric] == ""
            std = want[f"std {metric}"]
            assert (row[f"std({metric})"] == "") if std is None else float(row[f"std({metric})"]) == pytest.approx(std)


def test_two_seeds_of_one_config_are_one_row_with_mean_std_and_n(reported_grid):
    grid, _ = reported_grid
    seed_runs = [json.loads((grid / job / "summary.json").read_text())["metrics"][SPM] for job in ("0", "8")]
    row = next(r for r in read_csv(grid / "report" / "ranking.csv") if r["runs"].split() == ["0", "8"])
    assert row["n"] == "2"
    assert float(row[SPM]) == pytest.approx(statistics.fmean(seed_runs))
    assert float(row[f"std({SPM})"]) == pytest.approx(statistics.stdev(seed_runs))


def test_ranks_follow_the_means_and_the_pareto_set_is_the_non_dominated_configs(reported_grid):
    grid, _ = reported_grid
    expected = expected_configs(grid)
    rows = read_csv(grid / "report" / "ranking.csv")
    for metric in (SPM, ACCURACY):
        ranked = sorted((r for r in rows if r[metric]), key=lambda r: int(r[f"rank({metric})"]))
        means = [expected[row_config(r, grid)][f"mean {metric}"] for r in ranked]
        assert means == sorted(means, reverse=True)
    pareto = {row_config(r, grid) for r in rows if r["pareto"] == "True"}
    assert pareto == brute_force_pareto(expected)


def test_terminal_names_the_best_config_by_each_criterion_and_the_pareto_set(reported_grid):
    grid, out = reported_grid
    expected = expected_configs(grid)
    for metric in (SPM, ACCURACY):
        best = max((c for c in expected if expected[c]["n"]), key=lambda c: expected[c][f"mean {metric}"])
        line = next(text for text in out.splitlines() if text.startswith(f"Best by {metric}:"))
        # Labels drop the overrides every config shares; each remaining one must be the best's.
        label = line.split("'")[1]
        assert set(label.split()) <= set(best.split()) and label
    pareto_line = next(text for text in out.splitlines() if text.startswith("Pareto set"))
    assert pareto_line.startswith(f"Pareto set ({len(brute_force_pareto(expected))}):")
    assert "11 runs: 9 completed, 1 failed (oom ×1), 1 pending" in out


def test_dashboard_table_holds_the_same_numbers_as_the_summary_files(reported_grid):
    grid, _ = reported_grid
    expected = expected_configs(grid)
    rows = html_table(grid / "report" / "report.html", "configs-table")
    assert len(rows) == len(expected)
    for row in rows:
        first_run = row["runs"].split()[0]
        want = expected[config_of(summaries(grid)[first_run])]
        for metric in (SPM, ACCURACY):
            if want["n"]:
                assert float(row[metric]) == pytest.approx(want[f"mean {metric}"], rel=1e-12)


# ---- failed, pending and odd runs --------------------------------------------------------

def test_an_oom_run_is_a_row_with_its_failure_kind_in_every_table(reported_grid):
    grid, _ = reported_grid
    runs = {r["run"]: r for r in read_csv(grid / "report" / "runs.csv")}
    assert runs["9"]["status"] == "failed" and runs["9"]["failure.kind"] == "oom"
    assert "out of memory" in runs["9"]["failure.message"]
    failed_config = next(r for r in read_csv(grid / "report" / "ranking.csv") if r["runs"] == "9")
    assert failed_config["status"] == "failed" and failed_config["failures"] == "oom ×1"
    assert failed_config[f"rank({SPM})"] == ""
    html_runs = {r["run"]: r for r in html_table(grid / "report" / "report.html", "runs-table")}
    assert html_runs["9"]["failure.kind"] == "oom"


def test_a_sweep_still_running_reports_what_is_complete_and_counts_the_pending(reported_grid):
    grid, out = reported_grid
    assert "1 pending" in out
    pending = next(r for r in read_csv(grid / "report" / "runs.csv") if r["run"] == "10")
    # The half-written last line of metrics.jsonl is ignored, not reported as a problem.
    assert pending["status"] == "pending" and pending["last_step"] == "6" and pending["problems"] == ""
    assert all("10" not in r["runs"].split() for r in read_csv(grid / "report" / "ranking.csv"))


def test_jobs_a_grid_sweep_has_not_started_yet_are_counted_from_its_multirun_yaml(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    write_completed(sweep / "0", 0, "full_shard", "bf16", 0.1)
    write_completed(sweep / "1", 1, "shard_grad_op", "bf16", 0.1)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                    "params": {"fsdp": "full_shard,shard_grad_op", "loss.beta": "0.1,0.5"}},
        # The command line wins over the config for the same key: 3 betas, not 2.
        "overrides": {"task": ["loss.beta=0.1,0.5,1.0", "train.max_steps=30"]}}}))
    assert main([str(sweep)]) == 0
    assert "2 runs: 2 completed, 0 failed, 4 more planned by the sweep, not started yet" in capsys.readouterr().out


def test_an_unreadable_summary_is_listed_and_does_not_stop_the_report(grid, capsys):
    (grid / "3" / "summary.json").write_text('{"schema": 1, "status": "compl')
    assert main([str(grid)]) == 0
    screen = capsys.readouterr().out
    assert f"unreadable: {grid / '3' / 'summary.json'}: is not valid JSON" in screen  # on the screen, by name
    row = next(r for r in read_csv(grid / "report" / "runs.csv") if r["run"] == "3")
    assert row["status"] == "unreadable" and "not valid JSON" in row["problems"]


def test_an_unparsable_hydra_config_of_a_pending_run_is_named_on_the_screen(grid, capsys):
    (grid / "3" / "summary.json").unlink()  # still running: its config comes from .hydra/
    (grid / "3" / ".hydra" / "config.yaml").write_text("train: {lr: [0.1\n")
    assert main([str(grid)]) == 0
    screen = capsys.readouterr().out
    assert f"unreadable: {grid / '3' / '.hydra' / 'config.yaml'}: is not readable YAML (" in screen, screen
    row = next(r for r in read_csv(grid / "report" / "runs.csv") if r["run"] == "3")
    assert row["status"] == "pending" and "config.yaml is not readable YAML" in row["problems"]


def test_a_directory_without_runs_is_refused_with_status_2(tmp_path, capsys):
    (tmp_path / "empty" / "logs").mkdir(parents=True)
    assert main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(tmp_path / "empty") in err and "summary.json" in err
    assert not (tmp_path / "empty" / "report").exists()


def test_a_missing_directory_is_refused_with_status_2(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "not a directory" in capsys.readouterr().err


# ---- ties ------------------------------------------------------------------------------

def _two_seed_configs(sweep: Path, speeds: dict[str, tuple[float, float]]) -> None:
    job = 0
    for sharding, values in speeds.items():
        for seed, speed in enumerate(values):
            metrics = {"perf/speed_per_memory": speed, "eval/rewards/accuracies": 0.8, "steps": 30}
            write_run(sweep / str(job), job, [f"fsdp={sharding}", f"train.seed={seed}"],
                      resolved_config(sharding, "bf16", 0.1, 32, seed), status="completed", metrics=metrics)
            job += 1


def test_top_two_within_their_spread_are_called_too_close(tmp_path, capsys):
    # Means 100 and 99, standard deviations about 7 and 1.4: the gap is inside the noise.
    _two_seed_configs(tmp_path / "sweep", {"full_shard": (95.0, 105.0), "shard_grad_op": (98.0, 100.0)})
    assert main([str(tmp_path / "sweep")]) == 0
    note = next(text for text in capsys.readouterr().out.splitlines() if text.startswith(f"Note: {SPM}"))
    assert "within their spread" in note and "too close to call" in note
    assert "fsdp=full_shard" in note and "fsdp=shard_grad_op" in note


def test_a_clear_lead_is_called_so(tmp_path, capsys):
    _two_seed_configs(tmp_path / "sweep", {"full_shard": (150.0, 152.0), "shard_grad_op": (98.0, 100.0)})
    assert main([str(tmp_path / "sweep")]) == 0
    note = next(text for text in capsys.readouterr().out.splitlines() if text.startswith(f"Note: {SPM}"))
    assert "the leader is ahead by 52.0" in note


# ---- Optuna ------------------------------------------------------------------------------

def test_optuna_sweep_shows_every_trial_and_the_studys_own_pareto_trials(tmp_path, capsys):
    import optuna

    sweep = optuna_sweep(tmp_path / "optuna-sweep", study_name="dpo-pareto")
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    study = optuna.load_study(study_name="dpo-pareto", storage=f"sqlite:///{sweep}/optuna.db")
    pareto_numbers = {t.number for t in study.best_trials}
    assert "Optuna study 'dpo-pareto'" in out and "6 trials (5 complete, 1 fail)" in out
    assert "2 more planned by the sweep, not started yet" in out  # n_trials: 8
    assert "objectives: perf/speed_per_memory (maximize), eval/rewards/accuracies (maximize)" in out
    assert {int(text.split("#")[1].split()[0]) for text in out.splitlines() if "Pareto trials: #" in text} == pareto_numbers

    trials = html_table(sweep / "report" / "report.html", "trials-0")
    assert [int(t["trial"]) for t in trials] == [t.number for t in study.trials]
    assert {int(t["trial"]) for t in trials if t["pareto"] == "1"} == pareto_numbers
    # Each trial points at the job folder that ran it (Hydra numbers jobs like trials).
    assert all(t["run"] == t["trial"] for t in trials)
    assert (sweep / "report" / "optuna-0.png").stat().st_size > 10_000


def test_single_objective_study_marks_optunas_best_trial(tmp_path):
    import optuna

    sweep = grid_sweep(tmp_path / "sweep")
    study = optuna.create_study(study_name="beta", storage=f"sqlite:///{sweep}/optuna.db", direction="maximize")
    for job in range(4):
        accuracy = json.loads((sweep / str(job) / "summary.json").read_text())["metrics"][ACCURACY]
        trial = study.ask()
        trial.suggest_categorical("loss.beta", [0.1, 0.5])
        study.tell(trial, accuracy)
    assert main([str(sweep)]) == 0
    trials = html_table(sweep / "report" / "report.html", "trials-0")
    assert [int(t["trial"]) for t in trials if t["best"] == "1"] == [study.best_trial.number]


# ---- outputs, layouts, command line ------------------------------------------------------

def test_dashboard_is_one_self_contained_file_and_figures_are_pngs(reported_grid):
    grid, _ = reported_grid
    out = grid / "report"
    page = (out / "report.html").read_text()
    for external in ("<script src", "<link rel=\"stylesheet\"", "src=\"http", "href=\"http", "@import", "url("):
        assert external not in page
    assert page.count('src="data:image/png;base64,') == 4
    for name in ("pareto", "heatmap", "effects", "curves"):
        assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_runs_nested_deeper_and_several_sweeps_are_found(tmp_path, capsys):
    grid_sweep(tmp_path / "multirun" / "2026-11-30" / "12-00-00")
    second = tmp_path / "multirun" / "2026-11-30" / "13-00-00"
    write_completed(second / "0", 0, "full_shard", "fp32", 0.1, seed=2, seed_override=True)
    assert main([str(tmp_path / "multirun")]) == 0
    runs = read_csv(tmp_path / "multirun" / "report" / "runs.csv")
    assert len(runs) == 12 and "2026-11-30/13-00-00/0" in {r["run"] for r in runs}
    # The third seed of full_shard fp32 beta 0.1 joins the two of the first sweep.
    row = next(r for r in read_csv(tmp_path / "multirun" / "report" / "ranking.csv") if r["n"] == "3")
    assert row["runs"].split() == ["2026-11-30/12-00-00/0", "2026-11-30/12-00-00/8", "2026-11-30/13-00-00/0"]


def test_several_sweep_dirs_write_to_out(tmp_path):
    a = grid_sweep(tmp_path / "a")
    b = tmp_path / "b"
    write_completed(b / "0", 0, "no_shard", "bf16", 0.1)
    assert main([str(a), str(b), "--out", str(tmp_path / "combined")]) == 0
    runs = {r["run"] for r in read_csv(tmp_path / "combined" / "runs.csv")}
    assert {"a/0", "b/0"} <= runs and not (a / "report").exists()


def test_rerunning_on_a_finished_sweep_updates_the_report_in_place(grid):
    assert main([str(grid)]) == 0
    (grid / "10" / "metrics.jsonl").unlink()
    write_completed(grid / "10", 10, "no_shard", "bf16", 0.1)
    assert main([str(grid)]) == 0
    statuses = {r["run"]: r["status"] for r in read_csv(grid / "report" / "runs.csv")}
    assert statuses["10"] == "completed" and "report" not in statuses
    assert math.isfinite(float(next(r for r in read_csv(grid / "report" / "ranking.csv") if r["runs"] == "10")[SPM]))


def test_a_broken_last_line_of_an_ended_run_is_named_on_the_screen(tmp_path, capsys):
    """A half-written last line is expected only while the run goes on: once summary.json is there, it is
    a file the report could not read in full, named like any other."""
    sweep = tmp_path / "sweep"
    write_completed(sweep / "0", 0, "full_shard", "bf16", 0.1)
    write_completed(sweep / "1", 1, "shard_grad_op", "bf16", 0.1)
    log = sweep / "1" / "metrics.jsonl"
    lines = len(log.read_text().splitlines())
    with log.open("a") as f:
        f.write('{"step": 99, "train/lo')
    assert main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert f"unreadable: {log}: line {lines + 1} is not JSON; skipped" in out, out
    runs = {r["run"]: r for r in read_csv(sweep / "report" / "runs.csv")}
    assert runs["1"]["problems"] == f"metrics.jsonl line {lines + 1} is not JSON; skipped" and runs["0"]["problems"] == ""
