"""What a sweep will cost, before it starts (launchers/cost_screen.py) and after (the report's predicted
against measured step time): real CLI processes, real profiles from conf/cluster."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO, run_cli
from support.sweeps import run_sweep

QUICKSTART = ["+sweep=quickstart", "hydra.sweeper.dry_run=true"]


def test_a_dry_run_on_a_named_cluster_lists_each_points_cost_beside_its_fit_and_the_total(tmp_path):
    result = run_sweep(tmp_path / "sweep", *QUICKSTART, "cluster=h100_sxm", timeout=300)
    assert result.returncode == 0, result.output[-3000:]
    predicted = [line for line in result.stdout.splitlines() if line.strip().startswith("predicted: step")]
    assert len(predicted) == 8, result.stdout
    for line in predicted:  # every figure with its interval; the fit check against the H100's 80 GiB
        # the step expected from the data's own lengths, the worst case (every row at its longest) beside it
        for figure in (" s expected (worst case ", "tok/s/device", "MFU", "device-h (worst case "):
            assert figure in line
        assert line.count("[") >= 4 and line.endswith("fits 80 GiB")
    total = next(line for line in result.stdout.splitlines() if line.startswith("predicted total:"))
    assert "device-hours [" in total and "expected from the data's lengths; worst case" in total
    assert not (tmp_path / "sweep").exists()  # nothing started


def test_the_fit_verdict_uses_resources_device_memory_gib_over_the_clusters(tmp_path):
    result = run_sweep(tmp_path / "sweep", *QUICKSTART, "cluster=a100_40gb", "resources.device_memory_gib=0.001",
                       timeout=300)
    assert result.returncode == 0, result.output[-3000:]
    assert "8 predicted not to fit their device" in result.stdout  # 0.001 GiB, not the A100's 40


@pytest.mark.parametrize(("overrides", "refusal"), [
    (["resources.nproc_per_node=16"], "resources.nproc_per_node: 16 on cluster=h100_sxm, whose nodes have 8 devices"),
    (["cluster.inter_node_gb_s=-5"], "cluster.inter_node_gb_s: got -5"),
    (["+cluster.peak_tflops.fp8=1979"], "cluster.peak_tflops.fp8: unknown precision"),
])
def test_a_cluster_the_run_does_not_fit_or_an_impossible_profile_is_refused_in_one_line(tmp_path, overrides, refusal):
    result = run_sweep(tmp_path / "sweep", *QUICKSTART, "cluster=h100_sxm", *overrides, timeout=300)
    assert result.returncode != 0
    assert refusal in result.output, result.output[-3000:]


def test_a_custom_profile_file_missing_a_figure_is_refused_naming_it(tmp_path):
    conf = tmp_path / "myconf" / "cluster"
    conf.mkdir(parents=True)
    good = (REPO / "conf" / "cluster" / "a100_80gb.yaml").read_text()
    (conf / "mine.yaml").write_text("\n".join(line for line in good.splitlines()
                                              if not line.startswith("memory_bandwidth_gb_s")))
    result = run_sweep(tmp_path / "sweep", *QUICKSTART, "cluster=mine",
                       f"hydra.searchpath=[file://{tmp_path / 'myconf'}]", timeout=300)
    assert result.returncode != 0
    assert "cluster.memory_bandwidth_gb_s: missing" in result.output, result.output[-3000:]


@pytest.mark.slow  # measures this CPU's profile, times the run's passes, trains
def test_a_single_run_on_cluster_cpu_times_its_passes_before_it_starts_and_records_its_prediction(tmp_path):
    run = run_cli(tmp_path / "run", "cluster=cpu", "train.max_steps=4", "perf.warmup_steps=1",
                  "train.eval_every=0", "data.num_train_pairs=64", "data.num_eval_pairs=16")
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = run.summary["metrics"]
    assert metrics["perf/step_time_predicted_profile"] == "cpu", metrics.get("perf/step_time_predicted_reason")
    assert 0 < metrics["perf/step_time_predicted_low_s"] < metrics["perf/step_time_predicted_s"] \
        < metrics["perf/step_time_predicted_high_s"]


@pytest.mark.slow  # a training run, then the report
def test_a_run_records_its_predicted_step_time_and_the_report_plots_it_against_the_measured(tmp_path):
    run = run_cli(tmp_path / "run", "cluster=h100_sxm", "train.max_steps=4", "perf.warmup_steps=1",
                  "train.eval_every=0", "data.num_train_pairs=64", "data.num_eval_pairs=16")
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = run.summary["metrics"]
    assert metrics["perf/step_time_predicted_profile"] == "h100_sxm"
    assert 0 < metrics["perf/step_time_predicted_low_s"] < metrics["perf/step_time_predicted_s"] \
        < metrics["perf/step_time_predicted_high_s"]
    assert metrics["perf/step_time_s"] > 0
    report = subprocess.run([sys.executable, "analysis/report.py", str(tmp_path / "run"), "--out",
                             str(tmp_path / "report")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "Predicted vs measured step time (s):" in report.stdout
    assert "predicted step time: median absolute error" in report.stdout
    assert (tmp_path / "report" / "predicted.png").stat().st_size > 1000
    assert 'id="predicted"' in (tmp_path / "report" / "report.html").read_text()
