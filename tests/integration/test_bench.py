"""The benchmarks run: a seconds-long smoke of bench/dpo_vs_trl.py (ours and the bare loop; TRL is an
optional extra CI does not install), bench/gpu_check.sh at its CPU size (bench/gpu_dpo.py --tiny
among its checks), bench/find_best_vs_grid.py --smoke, bench/eval_throughput.py --smoke and bench/steadiness.py; the probe bench's ranking and pair-test helpers on known
numbers. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import REPO, cli_env

sys.path.insert(0, str(REPO / "bench"))  # the bench scripts' helpers, imported by the unit tests below


def run_script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_dpo_vs_trl_smoke_measures_ours_and_the_bare_loop(tmp_path):
    proc = run_script("bench/dpo_vs_trl.py", "--smoke", "--frameworks", "ours,bare", "--workdir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["runs"]) == {"ours", "bare"}
    for runs in results["runs"].values():
        (run,) = runs
        assert run["pairs_per_s"] > 0 and run["tokens_per_s"] > 0 and run["peak_rss_gb"] > 0.1
    assert "ours / bare: step time x" in proc.stdout
    # Ours ran the real CLI with its default techniques; its own summary agrees it completed.
    summary = json.loads((tmp_path / "ours-0" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["metrics"]["steps"] == results["workload"]["steps"]
    assert summary["metrics"]["perf/reference_precompute_s"] > 0


@pytest.mark.slow
def test_eval_throughput_smoke_times_training_and_evaluation_of_both_eval_batchings():
    proc = run_script("bench/eval_throughput.py", "--smoke", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = proc.stdout.split("eval/train\n", 1)[1].splitlines()
    assert [line.split()[0] for line in table] == ["derived", "train_micro_batch"]
    assert all(float(v) > 0 for line in table for v in line.split()[1:])


@pytest.mark.slow
def test_find_best_vs_grid_smoke_compares_both_picks_and_their_compute(tmp_path):
    # Its sweeps go to a fresh folder under TMPDIR; the comparison reads their typed summaries.
    proc = subprocess.run([sys.executable, "bench/find_best_vs_grid.py", "--smoke"], cwd=REPO,
                          env={**cli_env(), "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (root,) = tmp_path.glob("find-best-vs-grid-*")
    assert len(list((root / "grid").glob("*/summary.json"))) == 2
    assert (root / "find_best" / "find_best.json").exists()
    assert "full grid    2 runs" in proc.stdout and "find_best spent" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_gpu_check_runs_every_check_at_its_cpu_size_and_writes_the_table_and_summaries(tmp_path):
    """bench/gpu_check.sh --cpu: the GPU machine's checks (bench/gpu_dpo.py --tiny among them) on a CPU."""
    env = {**cli_env(), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    checks = ["precision_fp32", "precision_bf16", "precision_fp16", "llama1b_bf16", "sweep_job0", "sweep_job1",
              "kill_and_resume"]
    table = (tmp_path / "results.md").read_text()
    for check in checks:
        assert f"| {check} | ok |" in table, table
        summary = json.loads((tmp_path / "summaries" / f"{check}.json").read_text())
        assert summary["status"] == "completed", (check, summary["failure"])
        m = summary["metrics"]
        assert m["perf/tokens_per_s"] > 0 and m["perf/peak_memory_gib"] > 0 and m["perf/peak_memory_estimate_gib"] > 0
        assert m["perf/mfu"] is None and m["perf/mfu_reason"] == "MFU is measured on GPUs only"
        # No CPU profile measured in the check's fresh cache: the prediction is null and says why.
        assert m["perf/step_time_predicted_s"] is None and m["perf/step_time_predicted_reason"]
    assert "| step s | predicted s [interval] |" in table
    assert json.loads((tmp_path / "summaries" / "kill_and_resume.json").read_text())["resumed_from_step"] == 2
    assert "7 of 7 checks passed" in table


def test_probe_bench_ranks_ties_at_their_average_and_maps_each_point_to_its_shape():
    from probe_vs_full import average_ranks, pooled, shape_probes, spearman

    assert list(average_ranks([3.0, 1.0, 3.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0 and spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # Two beta points share their shape's probe: tied there, a perfect order elsewhere gives rho < 1.
    probed = {("full_shard", "fp32", "0.1"): {"speed_per_memory": 2.0},
              ("shard_grad_op", "fp32", "0.1"): {"speed_per_memory": 5.0}}
    grid = [(s, "fp32", b) for s in ("full_shard", "shard_grad_op") for b in ("0.1", "0.5")]
    probe = shape_probes(probed, grid)
    assert probe[("full_shard", "fp32", "0.5")] is probed[("full_shard", "fp32", "0.1")]
    full = {c: {"speed_per_memory": v} for c, v in zip(grid, [1.0, 2.0, 3.0, 4.0])}
    rho = spearman([probe[c]["speed_per_memory"] for c in grid], [full[c]["speed_per_memory"] for c in grid])
    assert abs(rho - 0.8944) < 1e-3  # corr([1.5, 1.5, 3.5, 3.5], [1, 2, 3, 4]) = 4 / sqrt(4 * 5)
    twice = pooled([{c: {**full[c], "median_speed_per_memory": 1.0} for c in grid},
                    {c: {"speed_per_memory": 3.0, "median_speed_per_memory": 3.0} for c in grid}], grid)
    assert twice[grid[0]] == {"speed_per_memory": 2.0, "median_speed_per_memory": 2.0}


def test_probe_bench_tells_shapes_apart_only_where_the_full_runs_do():
    from probe_vs_full import rank_sum_p, separated_pairs

    # Exact two-sided rank-sum: 3 vs 3 fully apart is 2 of the 20 splits; 6 vs 6, 2 of 924.
    assert abs(rank_sum_p([1, 2, 3], [4, 5, 6]) - 0.1) < 1e-12
    assert abs(rank_sum_p(list(range(6)), list(range(6, 12))) - 2 / 924) < 1e-12
    assert rank_sum_p([1, 4, 5, 8], [2, 3, 6, 7]) == 1.0  # same rank sums
    # Over the sampled path (more splits than the limit) the answer stays close to the exact one.
    assert abs(rank_sum_p(list(range(6)), list(range(6, 12)), limit=100) - 2 / 924) < 0.02

    grid = [(s, p, b) for s in ("full_shard", "shard_grad_op") for p in ("fp32",) for b in ("0.1", "0.5")]
    fast, slow = ("shard_grad_op", "fp32"), ("full_shard", "fp32")
    fulls = [{c: {"speed_per_memory": (50.0 if c[:2] == fast else 40.0) + i + (0.5 if c[2] == "0.5" else 0)}
              for c in grid} for i in range(3)]
    (pair,) = separated_pairs({c: {"speed_per_memory": 1.0 if c[:2] == fast else 2.0} for c in grid}, fulls, grid)
    assert pair["a"] == slow and pair["b"] == fast
    assert pair["separated"] and pair["p"] < 0.01 and pair["full_diff"] < 0
    assert not pair["probe_agrees"]  # this probe put the slow shape first
    close = [{c: {"speed_per_memory": 40.0 + (i if c[:2] == fast else 2 - i) + (0.1 if c[2] == "0.5" else 0)}
              for c in grid} for i in range(3)]
    (pair,) = separated_pairs({c: {"speed_per_memory": 1.0} for c in grid}, close, grid)
    assert not pair["separated"]


def test_steadiness_times_the_same_work_on_every_core_in_full_windows():
    from steadiness import window_medians

    # Repeats by start time: windows [0, 1) and [1, 2) are full, the one holding the last repeat is not.
    samples = [(0.1, 0.05), (0.6, 0.07), (0.9, 0.06), (1.2, 0.2), (1.7, 0.1), (2.1, 0.4)]
    assert window_medians(samples, 1.0) == pytest.approx([0.06, 0.15])
    proc = run_script("bench/steadiness.py", "--seconds", "3", "--window", "1", timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    cores = [line for line in proc.stdout.splitlines() if line.startswith("core ")]
    assert len(cores) == len(os.sched_getaffinity(0))
    assert all("slowest/fastest window" in line and "nanx" not in line for line in cores)
