"""The fit check before launch: a sweep does not start the points whose estimated peak memory exceeds
`resources.device_memory_gib`; they are results (status skipped, kind oom_predicted), not failures."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO, run_cli
from support.sweeps import run_sweep

# A tiny model that fits in 4 GiB and a 1B-class one whose optimizer states alone do not.
TWO_MODELS = ["model=tiny_gpt2,llama_1b", "resources.device=cpu", "resources.device_memory_gib=4",
              "train.max_steps=3", "perf.warmup_steps=0"]


@pytest.mark.slow
def test_a_point_predicted_out_of_memory_is_skipped_and_reported(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_sweep(sweep_dir, *TWO_MODELS)
    assert result.returncode == 0, result.output[-3000:]

    fits, too_big = result.summary(0), result.summary(1)
    assert fits["status"] == "completed"
    assert fits["metrics"]["perf/peak_memory_gib"] < 4  # the one that ran did fit, as predicted
    assert too_big["status"] == "skipped"
    assert too_big["failure"]["kind"] == "oom_predicted"
    assert "exceeds resources.device_memory_gib 4.00 GiB" in too_big["failure"]["message"]
    assert too_big["metrics"]["perf/peak_memory_estimate_gib"] > 4
    assert not (sweep_dir / "1" / "metrics.jsonl").exists()  # it never started
    assert "skipped    1  (predicted out of memory, not started)" in result.stdout
    assert "#1  model=llama_1b" in result.stdout
    # The skipped point cost nothing; the screen estimates what not running it saved.
    assert too_big["device_seconds"] == 0.0 and fits["device_seconds"] > 0
    assert "by the fit check device-seconds (estimated)" in result.stdout

    report = subprocess.run([sys.executable, "analysis/report.py", str(sweep_dir)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "1 skipped (predicted out of memory" in report.stdout
    assert "oom_predicted" in (sweep_dir / "report" / "runs.csv").read_text()


@pytest.mark.slow  # multi-process runs; the fast lane keeps its budget
def test_skip_predicted_oom_false_launches_every_point(tmp_path):
    sweep_dir = tmp_path / "sweep"
    checked = run_sweep(sweep_dir, *TWO_MODELS, "hydra.sweeper.dry_run=true", timeout=300)
    assert "1 predicted not to fit their device" in checked.stdout, checked.output[-2000:]
    assert "dry run: 1 of 2 jobs would be launched" in checked.stdout
    forced = run_sweep(sweep_dir, *TWO_MODELS, "hydra.sweeper.dry_run=true", "hydra.sweeper.skip_predicted_oom=false",
                       timeout=300)
    assert "dry run: 2 of 2 jobs would be launched" in forced.stdout, forced.output[-2000:]


def test_a_device_memory_that_is_not_a_positive_number_is_refused_before_launch(tmp_path):
    result = run_sweep(tmp_path / "sweep", "resources.device_memory_gib=0", "hydra.sweeper.dry_run=true", timeout=300)
    assert result.returncode != 0
    assert "resources.device_memory_gib: got 0 (accepted: a number of GiB > 0" in result.output, result.output[-2000:]


def test_a_single_run_gets_the_fit_check_too_and_one_that_does_not_fit_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(run_dir, "resources.device=cpu", "resources.device_memory_gib=0.01")  # the tiny GPT-2
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: resources.device_memory_gib: the estimated peak, "), result.stderr[-2000:]
    assert "GiB per device, exceeds 0.01 GiB (accepted: a limit the run fits in" in result.stderr
    assert "Traceback" not in result.stderr and not run_dir.exists()  # refused before anything was written
