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
