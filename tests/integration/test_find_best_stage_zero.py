"""Stage 0 of the staged search (launchers/predicted_plans.py): with a cluster named, only the plans
predicted within hydra.sweeper.stages.predict_keep of the best speed per memory, and the best of each
strategy, are probed; find_best.json and the report say which were not and why."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from support import REPO
from support.sweeps import run_sweep

from dpo_sweeps.launchers.predicted_plans import PredictedPlan, keep_plans


def _plan(strategy: str, speed: float) -> PredictedPlan:
    return PredictedPlan(SimpleNamespace(overrides=[f"fsdp={strategy}"]), strategy, speed, None)


def test_stage_zero_keeps_the_plans_near_the_best_and_the_best_of_each_strategy():
    plans = [_plan("full_shard", 100.0), _plan("full_shard", 70.0), _plan("full_shard", 60.0),
             _plan("shard_grad_op", 40.0), _plan("shard_grad_op", 30.0)]
    kept, dropped = keep_plans(plans, 1.5)
    # 100 and 70 are within 1.5x of the best (>= 66.7); 40 is the best shard_grad_op plan.
    assert [p.speed_per_memory for p in kept] == [100.0, 70.0, 40.0]
    assert [p.speed_per_memory for p, _ in dropped] == [60.0, 30.0]
    assert all("more than 1.5x below the best plan's 100" in why for _, why in dropped)
    kept_all, dropped_none = keep_plans(plans, 10.0)
    assert len(kept_all) == 5 and not dropped_none


def test_a_dry_run_of_find_best_on_a_cluster_shows_what_stage_zero_would_probe(tmp_path):
    result = run_sweep(tmp_path / "fb", "+sweep=find_best", "cluster=h100_sxm", "hydra.sweeper.dry_run=true",
                       timeout=300)
    assert result.returncode == 0, result.output[-3000:]
    probed = [line for line in result.stdout.splitlines() if line.startswith("  probe ")]
    skipped = [line for line in result.stdout.splitlines() if line.startswith("  not probed ")]
    assert len(probed) + len(skipped) == 16 and probed and skipped
    assert f"stage 0: {len(probed)} of 16 plans" in result.stdout
    assert f"dry run: {len(probed)} probes of the parallel plan" in result.stdout
    assert any("fsdp=shard_grad_op" in line for line in probed) and any("fsdp=full_shard" in line for line in probed)


def test_predict_keep_below_one_is_refused(tmp_path):
    result = run_sweep(tmp_path / "fb", "+sweep=find_best", "cluster=h100_sxm", "hydra.sweeper.dry_run=true",
                       "hydra.sweeper.stages.predict_keep=0.5", timeout=300)
    assert result.returncode != 0
    assert "hydra.sweeper.stages.predict_keep: got 0.5 (accepted: a factor >= 1" in result.output


@pytest.mark.slow  # measures this CPU (cluster=cpu), probes, trains and reports
def test_stage_zero_on_this_cpu_probes_fewer_plans_and_the_report_says_which_and_why(tmp_path):
    sweep_dir = tmp_path / "fb"
    stages = ("hydra.sweeper.stages={systems: {precision: 'fp32,bf16', train.micro_batch_size: '4,8'}, "
              "algorithm: {loss.beta: '0.1'}, probe_steps: 3, top_k: 1, predict_keep: 1.01}")
    result = run_sweep(sweep_dir, "cluster=cpu", "resources.nproc_per_node=1", "train.max_steps=4",
                       "perf.warmup_steps=1", stages, timeout=900)
    assert result.returncode == 0, result.output[-3000:]
    found = json.loads((sweep_dir / "find_best.json").read_text())
    not_probed = found["stages"]["predicted"]["not_probed"]
    probed = len(list((sweep_dir / "probes").iterdir()))
    assert not_probed and probed + len(not_probed) == 4
    assert all("below the best plan" in p["reason"] and "[" in p["predicted"] for p in not_probed)
    report = subprocess.run([sys.executable, "analysis/report.py", str(sweep_dir)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert f"stage 0: {len(not_probed)} plans not probed" in report.stdout
