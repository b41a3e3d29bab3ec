"""dpo_sweeps.api.report: what dpo-sweeps-report writes, and each config's ranking.csv row to read in Python."""

from __future__ import annotations

import csv

import pytest
from support.eval_records import three_configs, write_config_run

from dpo_sweeps import api


def test_report_returns_each_configs_ranking_row_with_its_ties_beside_the_text_and_files(tmp_path):
    # full_shard the best; shard_grad_op 2 fewer right of 400 (tied, and faster); no_shard 60 fewer (worse).
    speeds = {"full_shard": 100.0, "shard_grad_op": 150.0, "no_shard": 200.0}
    for job, (sharding, correct) in enumerate(three_configs().items()):
        write_config_run(tmp_path / "sweep", job, sharding, correct, speed=speeds[sharding])

    report = api.report(tmp_path / "sweep")
    assert report.html == tmp_path / "sweep" / "report" / "report.html" and report.html.is_file()
    assert report.files[-1] == report.html and "Tied with the best accuracy" in report.text

    rows = {row["config"]: row for row in report.configs}
    assert set(rows) == {"fsdp=full_shard", "fsdp=shard_grad_op", "fsdp=no_shard"}
    assert [rows[f"fsdp={s}"]["tied_with_best"] for s in ("full_shard", "shard_grad_op", "no_shard")] == [
        True, True, False]
    assert [rows[f"fsdp={s}"]["rank_with_ties"] for s in ("full_shard", "shard_grad_op", "no_shard")] == [1, 1, 3]
    assert rows["fsdp=no_shard"]["diff_vs_best"] == pytest.approx(-60 / 400)
    worse_row = rows["fsdp=no_shard"]
    assert worse_row["diff_vs_best_ci95_low"] < -60 / 400 < worse_row["diff_vs_best_ci95_high"]
    assert worse_row["p_vs_best_adjusted"] < 0.05

    # The same rows, in the same order, as ranking.csv holds.
    with open(tmp_path / "sweep" / "report" / "ranking.csv", newline="") as handle:
        written = list(csv.DictReader(handle))
    assert [r["config"] for r in written] == [r["config"] for r in report.configs]
    assert [r["tied_with_best"] for r in written] == [str(r["tied_with_best"]) for r in report.configs]
