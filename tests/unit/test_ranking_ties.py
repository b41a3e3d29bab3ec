"""Ties with the best on accuracy, from real run directories (support.eval_records: eval_pairs.parquet as
the trainer writes it, summary.json by support.reports). Expected values come from scipy and statsmodels
called here."""

from __future__ import annotations

import contextlib
import csv
import io

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.stats.proportion import proportion_confint
from support.eval_records import three_configs, write_config_run, write_eval_pairs

from dpo_sweeps.analysis.ranking import rank_sweep
from dpo_sweeps.analysis.report import build_report
from dpo_sweeps.analysis.runs import load_runs
from dpo_sweeps.ranking.eval_pairs import read_final_eval
from dpo_sweeps.ranking.ties import ConfigEval, compare_with_best


def _by_sharding(ranking) -> dict:
    return {c.settings["fsdp"]: c for c in ranking.configs}


def test_a_near_copy_of_the_best_is_tied_and_a_clearly_worse_config_ranks_below_both(tmp_path):
    outcomes = three_configs()
    speeds = {"full_shard": 100.0, "shard_grad_op": 150.0, "no_shard": 200.0}
    for job, (sharding, correct) in enumerate(outcomes.items()):
        write_config_run(tmp_path, job, sharding, correct, speed=speeds[sharding])
    ranking = rank_sweep(load_runs([tmp_path])[0])
    configs = _by_sharding(ranking)
    best, close, worse = (configs[s].versus_best for s in ("full_shard", "shard_grad_op", "no_shard"))

    # Reference p-values: McNemar's exact test is the binomial test of the discordant pairs; Holm over the
    # three pairs by hand (the two against no_shard are tiny, so the close pair's p is multiplied by 1).
    p_close = binomtest(2, 6, 0.5).pvalue
    p_worse = binomtest(0, 60, 0.5).pvalue
    p_close_worse = binomtest(2, 56, 0.5).pvalue  # no_shard right where shard_grad_op is wrong: 2 of 56
    assert close.p_vs_best == pytest.approx(p_close)
    assert close.p_vs_best_adjusted == pytest.approx(p_close)
    assert worse.p_vs_best_adjusted == pytest.approx(3 * p_worse)
    assert p_close_worse < 0.05 / 2
    assert (best.tied_with_best, close.tied_with_best, worse.tied_with_best) == (True, True, False)
    assert (best.rank_with_ties, close.rank_with_ties, worse.rank_with_ties) == (1, 1, 3)
    assert close.diff_vs_best == pytest.approx(-2 / 400)
    assert worse.diff_vs_best == pytest.approx(-60 / 400)
    assert worse.diff_vs_best_ci95_low < -60 / 400 < worse.diff_vs_best_ci95_high < 0
    assert close.diff_vs_best_ci95_low < 0 < close.diff_vs_best_ci95_high
    assert close.compared_on_pairs == 400 and close.method == "paired"
    # The continuous score: the log-ratio margin, lower on the pairs it gets wrong.
    assert close.score_name == "log-ratio margin" and close.score_diff_vs_best < 0

    # The front with ties: no_shard is significantly worse than both but the fastest, so it stays; full_shard
    # is tied with the faster shard_grad_op, so nothing dominates it either: a config leaves the front only where
    # another is significantly better and no slower.
    assert {c.settings["fsdp"] for c in ranking.pareto} == {"full_shard", "shard_grad_op", "no_shard"}
    # The pick: the fastest per GiB of the tied set.
    from dpo_sweeps.analysis.recommendation import recommend_tied
    assert recommend_tied(ranking).settings["fsdp"] == "shard_grad_op"


def test_a_significantly_better_and_faster_config_takes_the_slower_one_off_the_front(tmp_path):
    outcomes = three_configs()
    write_config_run(tmp_path, 0, "full_shard", outcomes["full_shard"], speed=200.0)
    write_config_run(tmp_path, 1, "no_shard", outcomes["no_shard"], speed=100.0)
    ranking = rank_sweep(load_runs([tmp_path])[0])
    assert [c.settings["fsdp"] for c in ranking.pareto] == ["full_shard"]


def test_the_report_writes_the_columns_and_says_what_the_held_out_set_resolves(tmp_path):
    for job, (sharding, correct) in enumerate(three_configs().items()):
        write_config_run(tmp_path / "sweep", job, sharding, correct, speed=100.0 + job)
    result = build_report([tmp_path / "sweep"])
    rows = {r["config"]: r for r in csv.DictReader((tmp_path / "sweep" / "report" / "ranking.csv").open())}
    assert rows["fsdp=no_shard"]["tied_with_best"] == "False" and rows["fsdp=no_shard"]["rank_with_ties"] == "3"
    assert rows["fsdp=shard_grad_op"]["tied_with_best"] == "True"
    assert float(rows["fsdp=no_shard"]["diff_vs_best"]) == pytest.approx(-0.15)
    for column in ("diff_vs_best_ci95_low", "diff_vs_best_ci95_high", "p_vs_best_adjusted"):
        assert rows["fsdp=no_shard"][column]
    # The Python API's record per config holds the same.
    api_rows = {r["config"]: r for r in result.configs}
    assert api_rows["fsdp=no_shard"]["rank_with_ties"] == 3 and api_rows["fsdp=shard_grad_op"]["tied_with_best"]
    text = result.text
    assert "Tied with the best accuracy (2 of 3" in text
    assert "What the held-out set can resolve:" in text and "with 400 pairs" in text
    assert "Recommended: 'fsdp=shard_grad_op'" in text  # the faster of the two tied
    page = (tmp_path / "sweep" / "report" / "report.html").read_text()
    assert 'id="ties"' in page and "tied_with_best" in page


def test_runs_without_per_pair_records_are_ranked_with_unpaired_wilson_intervals(tmp_path):
    write_config_run(tmp_path, 0, "full_shard", None, speed=100.0, accuracy=0.80, eval_pairs=500)
    write_config_run(tmp_path, 1, "shard_grad_op", None, speed=120.0, accuracy=0.78, eval_pairs=500)
    write_config_run(tmp_path, 2, "no_shard", None, speed=140.0, accuracy=0.60, eval_pairs=500)
    ranking = rank_sweep(load_runs([tmp_path])[0])
    configs = _by_sharding(ranking)
    close, worse = configs["shard_grad_op"].versus_best, configs["no_shard"].versus_best
    assert close.method == worse.method == "unpaired"
    assert configs["full_shard"].versus_best.accuracy_ci95 == pytest.approx(
        proportion_confint(400, 500, method="wilson"))
    assert configs["full_shard"].versus_best.accuracy_interval == "Wilson"
    assert close.tied_with_best and not worse.tied_with_best
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        from dpo_sweeps.analysis.report import main
        assert main([str(tmp_path)]) == 0
    assert "unpaired, without per-pair records" in printed.getvalue()


def test_a_sweep_mixing_runs_with_and_without_records_names_those_without(tmp_path):
    outcomes = three_configs()
    write_config_run(tmp_path, 0, "full_shard", outcomes["full_shard"], speed=100.0, eval_pairs=400)
    write_config_run(tmp_path, 1, "shard_grad_op", outcomes["shard_grad_op"], speed=110.0, eval_pairs=400)
    write_config_run(tmp_path, 2, "no_shard", None, speed=120.0, accuracy=0.70, eval_pairs=400)
    result = build_report([tmp_path])
    assert "without per-pair records (unpaired Wilson intervals): 'fsdp=no_shard'" in result.text
    rows = {r["config"]: r for r in result.configs}
    assert rows["fsdp=no_shard"]["compared_by"] == "unpaired" and rows["fsdp=shard_grad_op"]["compared_by"] == "paired"


def test_runs_whose_held_out_pairs_differ_are_compared_on_the_pairs_they_share(tmp_path):
    rng = np.random.default_rng(0)
    ids = [f"{i:016x}" for i in range(300)]
    a, b = rng.random(300) < 0.8, rng.random(300) < 0.6
    # full_shard scored pairs 0-299, shard_grad_op pairs 100-299 and 100 of its own (another split).
    write_config_run(tmp_path, 0, "full_shard", a, speed=100.0, ids=ids)
    others = ids[100:] + [f"{i:016x}" for i in range(1000, 1100)]
    write_config_run(tmp_path, 1, "shard_grad_op", b, speed=100.0, ids=others)
    ranking = rank_sweep(load_runs([tmp_path])[0])
    versus = _by_sharding(ranking)["shard_grad_op"].versus_best
    assert versus.compared_on_pairs == 200
    shared_a, shared_b = a[100:], b[:200]
    assert versus.diff_vs_best == pytest.approx(shared_b.mean() - shared_a.mean())
    only_a, only_b = int(np.sum(shared_a & ~shared_b)), int(np.sum(~shared_a & shared_b))
    assert versus.p_vs_best == pytest.approx(binomtest(min(only_a, only_b), only_a + only_b, 0.5).pvalue)
    text = build_report([tmp_path]).text
    assert "compared on the 200 pair(s) they share (of 300)" in text


def test_several_seeds_are_lined_up_by_pair_and_compared_on_their_seed_means(tmp_path):
    outcomes = three_configs()
    for seed in range(2):
        write_config_run(tmp_path, seed, "full_shard", outcomes["full_shard"], speed=100.0, seed=seed)
        write_config_run(tmp_path, 2 + seed, "no_shard", outcomes["no_shard"], speed=100.0, seed=seed)
    ranking = rank_sweep(load_runs([tmp_path])[0])
    versus = _by_sharding(ranking)["no_shard"].versus_best
    assert versus.method == "paired" and versus.compared_on_pairs == 400
    assert not versus.tied_with_best and versus.diff_vs_best == pytest.approx(-0.15)


def test_a_config_whose_every_eval_is_nan_ranks_last_with_its_reason(tmp_path):
    outcomes = three_configs()
    write_config_run(tmp_path, 0, "full_shard", outcomes["full_shard"], speed=100.0)
    write_config_run(tmp_path, 1, "shard_grad_op", outcomes["no_shard"], speed=100.0)
    write_config_run(tmp_path, 2, "no_shard", None, speed=300.0)  # accuracy null: the loss went NaN
    ranking = rank_sweep(load_runs([tmp_path])[0])
    nan_config = _by_sharding(ranking)["no_shard"].versus_best
    assert nan_config.rank_with_ties == 3 and not nan_config.tied_with_best
    assert "every eval of its 1 completed run(s) is NaN" in nan_config.note
    text = build_report([tmp_path]).text
    assert "ranked last (3), no accuracy: 'fsdp=no_shard' (every eval" in text


def test_the_final_eval_is_the_largest_step_and_a_reference_free_loss_scores_the_policy_margin(tmp_path):
    correct = np.array([True, False, True, True])
    write_eval_pairs(tmp_path, correct, reference_free=True)
    final = read_final_eval(tmp_path)
    assert final.step == 30 and final.score_name == "policy margin"
    assert final.correct.tolist() == correct.tolist()  # not the earlier step's, which is the opposite
    assert final.score.tolist() == [1.5, -0.5, 1.5, 1.5]
    write_eval_pairs(tmp_path, correct)
    assert read_final_eval(tmp_path).score_name == "log-ratio margin"


def test_with_every_config_alike_nothing_is_called_better():
    rng = np.random.default_rng(3)
    difficulty = rng.normal(size=(1000, 1))
    from dpo_sweeps.ranking.eval_pairs import PairRecords

    ids = np.array([f"{i:08x}" for i in range(1000)])
    configs = []
    for c in range(5):
        correct = (difficulty + rng.normal(size=(1000, 1)) > -0.5).astype(float)
        configs.append(ConfigEval(f"c{c}", float(correct.mean()), PairRecords(ids, correct, correct, "x", 1000), 1000))
    quality = compare_with_best(configs, resamples=0)
    assert not quality.better.any()
    assert all(v.tied_with_best and v.rank_with_ties == 1 for v in quality.versus)
    assert quality.tests == 10  # every pair, not only those with the best


def test_an_unreadable_eval_pairs_file_is_named_and_its_config_compared_without_records(tmp_path):
    outcomes = three_configs()
    write_config_run(tmp_path, 0, "full_shard", outcomes["full_shard"], speed=100.0, eval_pairs=400)
    broken = write_config_run(tmp_path, 1, "shard_grad_op", outcomes["shard_grad_op"], speed=110.0, eval_pairs=400)
    (broken / "eval_pairs.parquet").write_bytes(b"not parquet")
    runs = load_runs([tmp_path])[0]
    configs = _by_sharding(rank_sweep(runs))
    assert configs["shard_grad_op"].versus_best.method == "unpaired"
    problems = next(r for r in runs if r.path == broken).problems
    assert any(p.startswith("eval_pairs.parquet is not readable") and p.endswith("; compared without it")
               for p in problems), problems
