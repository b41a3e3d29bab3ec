"""The staged search (`hydra.sweeper.stages`, +sweep=find_best): probe the parallel plans, train the
algorithm settings on the best of them, recommend one run and the command that trains it."""

from __future__ import annotations

import html
import json
import re
import shlex
import subprocess
import sys

import pytest
from support import REPO, run_cli
from support.sweeps import run_sweep

# Two plans probed for 3 steps; the algorithm (two betas) trained for 8 steps on the faster one.
SMALL_STAGES = ["resources.nproc_per_node=1", "train.max_steps=8", "perf.warmup_steps=1",
                "hydra.sweeper.stages={systems: {precision: 'fp32,bf16'}, algorithm: {loss.beta: '0.1,0.5'}, "
                "probe_steps: 3, top_k: 1}"]


@pytest.mark.slow
def test_find_best_probes_the_plans_trains_the_best_and_recommends_a_command_that_reproduces_it(tmp_path):
    sweep_dir = tmp_path / "find_best"
    result = run_sweep(sweep_dir, *SMALL_STAGES)
    assert result.returncode == 0, result.output[-3000:]

    probes = {p.name: json.loads((p / "summary.json").read_text()) for p in (sweep_dir / "probes").iterdir()}
    assert sorted(probes) == ["0", "1"]
    assert all(s["metrics"]["probe/steps"] == 3 for s in probes.values())
    fastest = max(probes.values(), key=lambda s: s["metrics"]["perf/speed_per_memory"])
    trained = [json.loads((p / "summary.json").read_text()) for p in sorted((sweep_dir / "train").iterdir())]
    assert [p.name for p in sorted((sweep_dir / "train").iterdir())] == ["2", "3"]  # numbered after the probes
    # Stage 3 trained every beta on the plan with the best speed per memory, and only on it.
    assert {s["config"]["precision"]["name"] for s in trained} == {fastest["config"]["precision"]["name"]}
    assert sorted(s["config"]["loss"]["beta"] for s in trained) == [0.1, 0.5]
    assert all(s["status"] == "completed" and s["metrics"].get("probe/steps") is None for s in trained)

    # What each run cost, and the sweep's total per stage.
    for summary in [*probes.values(), *trained]:
        assert summary["started_at"] < summary["ended_at"] and summary["wall_s"] > 0 and summary["device_kind"] == "cpu"
        assert summary["device_seconds"] == pytest.approx(summary["wall_s"])  # one rank each
    assert "cost       " in result.stdout
    # Each stage says how long it will take here (or why it cannot yet) before its first job, naming the stage.
    for stage in ("probes", "train"):
        assert re.search(rf"^stage '{stage}': 2 runs[,;] ", result.stdout, re.MULTILINE), result.stdout[-3000:]

    answer = json.loads((sweep_dir / "find_best.json").read_text())
    spent = answer["stages"]["probes"]["device_seconds"]["cpu"] + answer["stages"]["train"]["device_seconds"]["cpu"]
    assert spent == pytest.approx(sum(s["device_seconds"] for s in [*probes.values(), *trained]))
    rec = answer["recommendation"]
    best = max(s["metrics"]["eval/rewards/accuracies"] for s in trained)
    # The pick is tied with the best accuracy (the best itself among the tied) and the fastest of them per GiB.
    tied = [c for c in answer["candidates"] if c["tied_with_best"]]
    assert rec["run"] in rec["tied_with_best"] and set(rec["tied_with_best"]) == {c["run"] for c in tied}
    assert answer["decided_by"] == rec["decided_by"] == "training stage"
    assert max(c["eval/rewards/accuracies"] for c in tied) == best
    assert rec["perf/speed_per_memory"] == max(c["perf/speed_per_memory"] for c in tied)
    assert answer["stages"]["probes"]["completed"] == 2 and answer["stages"]["train"]["completed"] == 2
    assert "===== recommendation =====" in result.stdout and f"train it {rec['command']}" in result.stdout

    # The report opens with the same recommendation.
    report = subprocess.run([sys.executable, "analysis/report.py", str(sweep_dir)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert f"train it: {rec['command']}" in report.stdout
    assert "cost: " in report.stdout
    page = (sweep_dir / "report" / "report.html").read_text()
    assert page.index('id="recommendation"') < page.index('id="configs"')
    assert html.escape(rec["command"], quote=False) in page

    # The command trains exactly the recommended run's config.
    args = shlex.split(rec["command"])
    assert args[:3] == ["python", "-m", "dpo_sweeps"]
    again = run_cli(tmp_path / "again", *args[3:], quiet=False)
    assert again.returncode == 0, again.stderr[-3000:]
    recommended = json.loads((sweep_dir / rec["run"].split(str(sweep_dir) + "/")[-1] / "summary.json").read_text())
    assert again.summary["config_hash"] == recommended["config_hash"]


def test_stages_that_cannot_work_are_refused_before_anything_runs(tmp_path):
    result = run_sweep(tmp_path / "fb", "hydra.sweeper.stages={systems: {precision: fp32}, algorithm: {loss.beta: '0.1'}, "
                       "top_k: 0}", "hydra.sweeper.dry_run=true", timeout=300)
    assert result.returncode != 0
    assert "hydra.sweeper.stages.top_k: got 0 (accepted: an integer >= 1)" in result.output, result.output[-2000:]


@pytest.mark.slow
def test_full_fine_tuning_and_lora_are_both_trained_and_weighed_by_accuracy(tmp_path):
    """peft is a plan setting that changes what is learned: with top_k 1 the fastest plan of each peft variant
    is still trained, find_best.json and the report put the best of each side by side, and the
    recommendation is chosen on trained accuracy across both."""
    sweep_dir = tmp_path / "find_best"
    result = run_sweep(sweep_dir, "model=tiny_llama", "resources.nproc_per_node=1", "train.max_steps=8",
                       "perf.warmup_steps=1", "peft.r=4",
                       "hydra.sweeper.stages={systems: {peft: 'none,lora'}, algorithm: {loss.beta: '0.1'}, "
                       "probe_steps: 3, top_k: 1}")
    assert result.returncode == 0, result.output[-3000:]
    trained = [json.loads((p / "summary.json").read_text()) for p in sorted((sweep_dir / "train").iterdir())]
    assert sorted(s["plan"]["adapters"] or "full" for s in trained) == ["LoRA r=4", "full"]

    answer = json.loads((sweep_dir / "find_best.json").read_text())
    by_peft = answer["by_peft"]
    assert [b["adapters"] for b in by_peft] == ["full fine-tune", "LoRA r=4"]
    for best, summary in zip(by_peft, sorted(trained, key=lambda s: s["plan"]["adapters"] is not None), strict=True):
        assert best["eval/rewards/accuracies"] == summary["metrics"]["eval/rewards/accuracies"]
        assert best["perf/peak_memory_gib"] == summary["metrics"]["perf/peak_memory_gib"]
    rec = answer["recommendation"]
    assert rec["run"] in rec["tied_with_best"]
    assert rec["best_accuracy_run"] in {b["run"] for b in by_peft}
    assert "best of each: full fine-tune " in result.stdout

    report = subprocess.run([sys.executable, "analysis/report.py", str(sweep_dir)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "Full fine-tuning against LoRA" in report.stdout and "LoRA r=4" in report.stdout
    page = (sweep_dir / "report" / "report.html").read_text()
    assert page.index("id='full-vs-lora'") < page.index('id="configs"')
