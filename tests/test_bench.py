"""The benchmarks run: a seconds-long smoke of bench/dpo_vs_trl.py (ours and the bare loop; TRL is an
optional extra CI does not install) and of bench/gpu_dpo.py on a CPU. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO, cli_env


def run_script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)


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


def test_gpu_script_runs_its_tiny_size_on_a_cpu(tmp_path):
    proc = run_script("bench/gpu_dpo.py", "--tiny", "--no-baseline", "--precisions", "fp32", "--device", "cpu",
                      "--workdir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert run["status"] == "completed", run
    assert run["tokens_per_s"] > 0 and run["peak_gib"] > 0 and run["estimate_gib"] > 0


def test_probe_bench_ranks_ties_at_their_average_and_maps_each_point_to_its_shape():
    sys.path.insert(0, str(REPO / "bench"))
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
