"""Pricing a sweep that has run (issue 48): the dry run with cluster= prices every point, completed or not,
and says which have run, with the step each measured beside its prediction."""

from __future__ import annotations

import re

import pytest
from support.sweeps import run_sweep

TWO_POINTS = ["train.max_steps=3", "perf.warmup_steps=1", "resources.nproc_per_node=1", "train.batch_size=8",
              "train.micro_batch_size=4"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A sweep of two points, run to completion on this machine's CPU."""
    sweep = tmp_path_factory.mktemp("finished") / "sweep"
    result = run_sweep(sweep, *TWO_POINTS, "loss.beta=0.1,0.5", timeout=600)
    assert result.returncode == 0, result.output[-3000:]
    return result


def test_a_dry_run_over_a_finished_sweep_prices_every_point_and_shows_what_each_measured(finished):
    # One point more than has run: it is priced to launch, the two completed ones priced again.
    dry = run_sweep(finished.sweep_dir, *TWO_POINTS, "loss.beta=0.1,0.5,1.0", "cluster=h100_sxm",
                    "hydra.sweeper.dry_run=true", timeout=300)
    assert dry.returncode == 0, dry.output[-3000:]
    out = dry.stdout
    assert "dry run: 1 of 3 jobs would be launched" in out and "2 already completed (skipped):" in out
    predicted = [line for line in out.splitlines() if line.strip().startswith("predicted: step")]
    assert len(predicted) == 3, out
    completed = out.split("already completed (skipped):", 1)[1]
    for num in (0, 1):
        measured = finished.summary(num)["metrics"]["perf/step_time_s"]
        # These ran on this CPU, not on an H100: what they measured is shown, not compared.
        assert f"ran on other hardware (cpu): measured {measured:.3g} s there" in completed
    assert re.search(r"completed points, priced again: predicted total: \S+ device-hours \[.*\] for 2 runs", out)
    assert re.search(r"^predicted total: \S+ device-hours \[.*\] for 1 runs", out, flags=re.MULTILINE)


@pytest.mark.slow  # measures this CPU's profile and times the points' passes
def test_on_the_hardware_the_runs_ran_on_their_measured_step_is_compared_with_the_prediction(finished):
    dry = run_sweep(finished.sweep_dir, *TWO_POINTS, "loss.beta=0.1,0.5", "cluster=cpu",
                    "hydra.sweeper.dry_run=true", timeout=600)
    assert dry.returncode == 0, dry.output[-3000:]
    assert "dry run: 0 of 2 jobs would be launched" in dry.stdout
    for num in (0, 1):
        measured = finished.summary(num)["metrics"]["perf/step_time_s"]
        assert re.search(rf"ran on this hardware: measured {re.escape(f'{measured:.3g}')} s, [+-]\d+% off, "
                         r"(inside|OUTSIDE) the interval", dry.stdout), dry.stdout
    assert "completed points, priced again: predicted total:" in dry.stdout
