"""Several losses in one sweep: the grid check before launch, the runs, each loss's own metrics in the report."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
from support import REPO, cli_env
from support.sweeps import run_sweep

LOSSES = ("sigmoid", "simpo", "orpo", "mix")


def test_a_hyperparameter_of_another_loss_is_refused_before_any_job_starts(tmp_path):
    # ++ forces the key into every point: ipo has it, sigmoid does not.
    result = run_sweep(tmp_path / "sweep", "loss=sigmoid,ipo", "++loss.length_normalized=true")
    assert result.returncode != 0
    assert "1 of 2 points of this sweep are invalid; no job was started" in result.output
    assert "loss.length_normalized: is not a hyperparameter of loss=sigmoid" in result.output
    assert not (tmp_path / "sweep").exists()


@pytest.fixture(scope="module")
def loss_sweep(tmp_path_factory):
    """The named losses sweep, cut to four losses and a few steps, and its report."""
    root = tmp_path_factory.mktemp("losses")
    env = {"DPO_SWEEPS_CACHE": str(root / "cache")}
    result = run_sweep(root / "sweep", "+sweep=losses", f"hydra.sweeper.params.loss='{','.join(LOSSES)}'",
                       "train.max_steps=4", "train.batch_size=8", "train.micro_batch_size=8", env=env)
    assert result.returncode == 0, result.output[-3000:]
    report = subprocess.run([sys.executable, "analysis/report.py", str(root / "sweep")], cwd=REPO, check=False,
                            env={**cli_env(), **env}, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    return result, report, root


@pytest.mark.slow
def test_every_loss_of_the_sweep_completes_and_logs_its_own_metrics(loss_sweep):
    result, _, _ = loss_sweep
    summaries = {result.summary(i)["config"]["loss"]["name"]: result.summary(i) for i in range(len(LOSSES))}
    assert set(summaries) == set(LOSSES)
    assert all(s["status"] == "completed" for s in summaries.values())
    assert {"eval/orpo/log_odds_ratio", "eval/orpo/log_odds_chosen", "eval/orpo/nll_loss"} <= set(
        summaries["orpo"]["metrics"])
    assert "eval/simpo/margin_minus_gamma" in summaries["simpo"]["metrics"]
    assert {"eval/mix/sigmoid", "eval/mix/bco_pair", "eval/mix/sft"} <= set(summaries["mix"]["metrics"])
    assert not any(k.startswith("eval/orpo") for k in summaries["sigmoid"]["metrics"])


@pytest.mark.slow
def test_reference_free_losses_build_score_and_cache_no_reference(loss_sweep):
    result, _, root = loss_sweep
    by_loss = {result.summary(i)["config"]["loss"]["name"]: i for i in range(len(LOSSES))}
    for name in ("simpo", "orpo"):
        run_dir = result.sweep_dir / str(by_loss[name])
        assert "perf/reference_precompute_s" not in result.summary(by_loss[name])["metrics"]
        assert "reference log-probs" not in "".join(p.read_text() for p in run_dir.glob("*.log"))
    assert "perf/reference_precompute_s" in result.summary(by_loss["sigmoid"])["metrics"]
    # sigmoid and mix score the same reference the same way: one cache file, made by whichever ran first.
    assert len(list((root / "cache" / "reference_logps").glob("*.pt"))) == 1


@pytest.mark.slow
def test_the_report_shows_each_loss_own_metrics(loss_sweep):
    _, report, root = loss_sweep
    assert "Each loss's own metrics" in report.stdout
    orpo_line = next(line for line in report.stdout.splitlines() if "(orpo):" in line)
    assert "orpo/log_odds_ratio" in orpo_line and "orpo/nll_loss" in orpo_line
    rows = list(csv.DictReader((root / "sweep" / "report" / "loss_metrics.csv").open()))
    assert {(r["loss.name"], r["metric"]) for r in rows} >= {
        ("orpo", "eval/orpo/log_odds_ratio"), ("simpo", "eval/simpo/margin_minus_gamma"), ("mix", "eval/mix/sft")}
    assert "loss-metrics-table" in (root / "sweep" / "report" / "report.html").read_text()
