"""The report as a script on a sweep whose runs wrote per-pair eval records (eval_pairs.parquet, as the
trainer writes it): the paired columns reach ranking.csv and the tied set the screen, in its own process."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
from support import REPO
from support.eval_records import write_config_run
from support.sweeps import run_sweep


def test_the_script_ranks_with_ties_on_the_pairs_every_run_scored(tmp_path):
    rng = np.random.default_rng(0)
    difficulty = rng.normal(size=600)
    # Four configs on 600 shared pairs, two seeds each: two alike at the top, one 4 points lower, one 15.
    for job, (sharding, shift) in enumerate({"full_shard": 0.0, "shard_grad_op": 0.0, "hybrid_shard": -0.12,
                                             "no_shard": -0.45}.items()):
        for seed in range(2):
            correct = difficulty + 0.6 * rng.normal(size=600) + 0.6 + shift > 0
            write_config_run(tmp_path / "sweep", 2 * job + seed, sharding, correct, speed=100.0 + 10 * job, seed=seed)
    done = subprocess.run([sys.executable, "analysis/report.py", str(tmp_path / "sweep")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {r["config"]: r for r in csv.DictReader((tmp_path / "sweep" / "report" / "ranking.csv").open())}
    assert rows["fsdp=no_shard"]["tied_with_best"] == "False"
    assert {rows[c]["tied_with_best"] for c in ("fsdp=full_shard", "fsdp=shard_grad_op")} == {"True"}
    assert all(r["compared_on_pairs"] in ("", "600") for r in rows.values())
    assert int(rows["fsdp=no_shard"]["rank_with_ties"]) >= 3
    for row in rows.values():
        if row["diff_vs_best_ci95_low"]:
            assert float(row["diff_vs_best_ci95_low"]) <= float(row["diff_vs_best"]) <= float(row["diff_vs_best_ci95_high"])
    assert "Tied with the best accuracy" in done.stdout and "What the held-out set can resolve" in done.stdout
    assert "Recommended: '" in done.stdout


def test_a_real_sweep_is_ranked_pair_by_pair_on_the_held_out_pairs_its_runs_wrote(tmp_path):
    """Two real one-rank runs (beta 0.1 and 0.5) write eval_pairs.parquet; the report pairs them on every
    held-out pair and says which is tied."""
    sweep_dir = tmp_path / "sweep"
    result = run_sweep(sweep_dir, "loss.beta=0.1,0.5", "train.max_steps=4", "train.eval_every=4",
                       "resources.nproc_per_node=1", timeout=600)
    assert result.returncode == 0, result.output[-3000:]
    held_out = {result.summary(n)["data"]["eval_pairs"] for n in range(2)}
    assert len(held_out) == 1
    assert all((sweep_dir / str(n) / "eval_pairs.parquet").is_file() for n in range(2))
    done = subprocess.run([sys.executable, "analysis/report.py", str(sweep_dir)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader((sweep_dir / "report" / "ranking.csv").open()))
    other = next(r for r in rows if r["diff_vs_best"] and float(r["diff_vs_best"]) <= 0 and r["compared_by"])
    assert other["compared_by"] == "paired" and int(other["compared_on_pairs"]) == held_out.pop()
    assert other["margin"] == "log-ratio margin" and other["p_vs_best_adjusted"]
    assert "Tied with the best accuracy" in done.stdout
