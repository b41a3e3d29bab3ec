"""The command prints its own forecast before it starts (issue 48, "Honest times"): a local sweep before its
first job, "2 runs, about N s on this machine (forecast, cluster=cpu; ...)", once this machine has measured
what the forecast reads; before that, why not, and a forecast at the first run's pace after it; a forecast
that cannot be made never stops a run; an Optuna study the same before its first trial. Real commands, a tiny
sweep of two points (a study of two trials) cut by DPO_SWEEPS_SMOKE."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import QUIET, REPO, cli_env

pytestmark = pytest.mark.slow  # the dry run that measures this CPU, a sweep's first run, a study's, short runs

TWO_POINTS = ["+sweep=quickstart", "fsdp=full_shard", "precision=fp32", "loss.beta=0.1,0.5"]
FORECAST = re.compile(r"^2 runs, about (\d+) (s|min) on this machine \(forecast, cluster=cpu; worst case "
                      r"(\d+) (s|min)(; PROVISIONAL: a timing taken on a busy machine)?\)$", re.MULTILINE)


def _command(args: tuple[str, ...], cache: Path) -> tuple[list[str], dict[str, str]]:
    env = {**cli_env(), "DPO_SWEEPS_CACHE": str(cache), "DPO_SWEEPS_SMOKE": "1"}
    flags = [a for a in args if a == "-m"]
    overrides = [a for a in args if a != "-m"]
    return [sys.executable, "-m", "dpo_sweeps", *flags, *QUIET, *overrides], env


def dpo_sweeps(*args: str, cache: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """The command (`-m` first for a sweep), its stdout and stderr as one stream (what a terminal shows, in
    order)."""
    command, env = _command(args, cache)
    return subprocess.run(command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout)


def printed_until(pattern: str, *args: str, cache: Path, timeout: float = 600) -> str:
    """The command's output up to the first line matching `pattern`; then the command and its ranks are
    killed (what follows is not this test's, and each sweep run left would cost the suite a run's time)."""
    command, env = _command(args, cache)
    proc = subprocess.Popen(command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if re.search(pattern, line):
                return "".join(lines)
        raise AssertionError(f"ended ({proc.wait()}) without printing {pattern!r}:\n{''.join(lines)[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


def before_first_job(output: str) -> str:
    assert "#0 started" in output, output[-3000:]
    return output.split("#0 started", 1)[0]


def test_a_sweep_prints_its_forecast_before_its_first_job(tmp_path):
    cache = tmp_path / "cache"
    first = printed_until(r"^1 run left, ", "-m", *TWO_POINTS, f"hydra.sweep.dir={tmp_path / 'first'}",
                          cache=cache)
    # A fresh machine: nothing to forecast from yet, said before the first job; the first run's pace after it.
    assert "2 runs; no forecast before the first run: no run like these has completed on this machine yet" \
        in before_first_job(first)
    after = first.split("[1/2] #0 completed", 1)[1]
    assert re.search(r"^1 run left, about \d+ (s|min) on this machine \(forecast at the first run's pace, \d+ s\)$",
                     after, re.MULTILINE), first[-3000:]

    # The dry run the line names measures this CPU and times the points' passes; then the forecast is made.
    measure = dpo_sweeps("-m", *TWO_POINTS, f"hydra.sweep.dir={tmp_path / 'second'}", "cluster=cpu",
                         "hydra.sweeper.dry_run=true", cache=cache)
    assert measure.returncode == 0, measure.stdout[-3000:]
    second = printed_until("#0 started", "-m", *TWO_POINTS, f"hydra.sweep.dir={tmp_path / 'second'}", cache=cache)
    found = FORECAST.search(before_first_job(second))
    assert found, second[-3000:]
    expected, worst = (int(n) * (60 if unit == "min" else 1) for n, unit in (found.group(1, 2), found.group(3, 4)))
    assert 0 < expected <= worst


def test_a_forecast_that_cannot_be_made_never_stops_the_run(tmp_path):
    cache = tmp_path / "not-a-folder"
    cache.write_text("")  # DPO_SWEEPS_CACHE names a file: nothing can be kept or read there
    sweep = dpo_sweeps("-m", *TWO_POINTS[:-1], "loss.beta=0.1", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                       cache=cache)
    assert sweep.returncode == 0, sweep.stdout[-3000:]
    assert f"1 run; no forecast: the cache folder DPO_SWEEPS_CACHE={cache} is not a writable folder" \
        in before_first_job(sweep.stdout)
    assert json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())["status"] == "completed"

    run_dir = tmp_path / "run"
    single = dpo_sweeps(*TWO_POINTS[:-1], "loss.beta=0.1", f"hydra.run.dir={run_dir}", cache=cache)
    assert single.returncode == 0, single.stdout[-3000:]
    before_training = single.stdout.split("[rank0]", 1)[0]
    assert f"1 run; no forecast: the cache folder DPO_SWEEPS_CACHE={cache}" in before_training, single.stdout[:3000]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


# A grid of two points asked for 20 trials: the study runs two, and its line counts two.
TWO_TRIALS = ["hydra/sweeper=optuna", "+sweep=optuna_dpo", "resources.nproc_per_node=1", "hydra/sweeper/sampler=grid",
              "hydra.sweeper.n_trials=20", "loss.beta=0.1", "train.lr=0.001", "train.batch_size=choice(16,32)"]


def test_an_optuna_study_prints_its_forecast_before_its_first_trial_and_records_its_trials(tmp_path):
    cache = tmp_path / "cache"
    study = printed_until(r"^1 trial left, ", "-m", *TWO_TRIALS, f"hydra.sweep.dir={tmp_path / 'study'}", cache=cache)
    # A fresh machine: why there is no forecast, before trial 0 starts; its pace once it has completed.
    before = study.split("trial 0: ", 1)[0]
    assert "2 trials; no forecast before the first trial: no run like these has completed on this machine yet" \
        in before, study[-3000:]
    assert re.search(r"^1 trial left, about \d+ (s|min) on this machine \(forecast at the first trial's pace, "
                     r"\d+ s\)$", study, re.MULTILINE), study[-3000:]
    assert len(list((cache / "cluster" / "run-rest").glob("*.json"))) == 1  # trial 0's time, for the next forecast

    # The dry run the line would name prices the search space's points on the cluster named (here a datasheet's,
    # which measures nothing; on cluster=cpu it measures this machine and times their passes).
    priced = dpo_sweeps("-m", *TWO_TRIALS, f"hydra.sweep.dir={tmp_path / 'dry'}", "cluster=h100_sxm",
                        "hydra.sweeper.dry_run=true", cache=cache)
    assert priced.returncode == 0, priced.stdout[-3000:]
    assert "predicted, a trial at each of 2 points of the search space:" in priced.stdout, priced.stdout[-3000:]
    assert re.search(r"^  train\.batch_size=32: step ", priced.stdout, re.MULTILINE), priced.stdout[-3000:]
