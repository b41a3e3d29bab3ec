"""The forecast line a sweep and a single run print before they start (dpo_sweeps/cost/forecast.py): what it
says where this machine has nothing to forecast from, and that a forecast that fails says why instead of
raising. tests/integration/test_forecast_printed.py runs the commands that print it."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from dpo_sweeps import api
from dpo_sweeps.config.schema import Config
from dpo_sweeps.cost.forecast import (
    Forecast,
    Planned,
    forecast_text,
    pace_text,
    record_run,
    timing_command,
    trials_forecast_text,
)

ARGV = ["-m", "+sweep=quickstart", "hydra.sweep.dir=/tmp/qs"]


@pytest.fixture
def quickstart_point() -> Config:
    cfg = api.compose(["+sweep=quickstart"])
    return Config.of({key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
                      for key in cfg if key != "hydra"})


def test_a_machine_that_never_ran_such_a_run_has_no_forecast_before_the_first_run(quickstart_point, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(tmp_path / "cache"))
    line = forecast_text([Planned(quickstart_point, 2)] * 8, ARGV)
    assert line == ("8 runs; no forecast before the first run: no run like these has completed on this machine "
                    "yet (the first one records its start-up and evaluations)")


def test_an_unmeasured_cpu_names_the_dry_run_that_measures_it(quickstart_point, tmp_path, monkeypatch):
    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(tmp_path / "cache"))
    record_run(quickstart_point, 2, "sweep", took_s=30.0, steps=60, step_s=0.1)
    line = forecast_text([Planned(quickstart_point, 2)] * 8, ARGV)
    assert line.startswith("8 runs; no forecast before the first run: this machine's CPU is not measured yet")
    assert "python -m dpo_sweeps -m +sweep=quickstart hydra.sweep.dir=/tmp/qs cluster=cpu " \
           "hydra.sweeper.dry_run=true" in line


def test_a_cache_that_is_a_file_gives_no_forecast_and_says_where(quickstart_point, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.write_text("")
    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(cache))
    record_run(quickstart_point, 2, "sweep", took_s=30.0, steps=60, step_s=0.1)  # records nothing, raises nothing
    assert forecast_text([Planned(quickstart_point, 2)], ARGV) == (
        f"1 run; no forecast: the cache folder DPO_SWEEPS_CACHE={cache} is not a writable folder, so this "
        "machine's timings cannot be kept")


def test_a_forecast_that_fails_says_so_in_its_line_instead_of_raising(quickstart_point, tmp_path, monkeypatch):
    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(tmp_path / "cache"))
    record_run(quickstart_point, 2, "sweep", took_s=30.0, steps=60, step_s=0.1)
    from dpo_sweeps.cost.cpu_profile import cache_path
    from dpo_sweeps.cost.predict import rank_threads

    cache_path(rank_threads(quickstart_point)).write_text(json.dumps({"threads": 1}))  # a profile cut short
    line = forecast_text([Planned(quickstart_point, 2)] * 2, ARGV)
    assert re.fullmatch(r"2 runs; no forecast \(KeyError: '\w+'\)", line), line


def test_the_dry_run_that_measures_is_the_command_itself_on_cluster_cpu():
    assert timing_command(["-m", "+sweep=quickstart", "cluster=h100_sxm", "hydra.sweeper.dry_run=false"]) == \
        "python -m dpo_sweeps -m +sweep=quickstart cluster=cpu hydra.sweeper.dry_run=true"
    assert timing_command(["train.lr=1e-3", "data.path=my data.jsonl"]) == \
        "python -m dpo_sweeps -m train.lr=1e-3 'data.path=my data.jsonl' cluster=cpu hydra.sweeper.dry_run=true"


def test_after_the_first_run_the_rest_goes_at_its_pace():
    assert pace_text(25.0, 7, 1) == "7 runs left, about 3 min on this machine (forecast at the first run's pace, 25 s)"
    assert pace_text(25.0, 1, 1) == "1 run left, about 20 s on this machine (forecast at the first run's pace, 25 s)"


def test_a_study_says_its_trials_are_priced_at_the_first_ones_settings():
    """An Optuna study knows one trial's settings before it starts: the line names them, and the trials run
    at once; the worst case names the points of the search space it also priced."""
    forecast = Forecast(runs=20, seconds=240.0, worst_seconds=540.0, provisional=False)
    assert forecast.text("trial", "at trial 0's settings, 2 at once") == (
        "20 trials, about 4 min on this machine (forecast at trial 0's settings, 2 at once, cluster=cpu; "
        "worst case 9 min)")
    wider = replace(forecast, worst_seconds=900.0, worst_basis=", the costliest of trial 0's settings and 3 points "
                    "of the search space")
    assert wider.text("trial", "at trial 0's settings, 2 at once") == (
        "20 trials, about 4 min on this machine (forecast at trial 0's settings, 2 at once, cluster=cpu; "
        "worst case 15 min, the costliest of trial 0's settings and 3 points of the search space)")


def test_a_study_on_a_machine_that_never_ran_such_a_trial_says_why_in_trials(quickstart_point, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(tmp_path / "cache"))
    line = trials_forecast_text(Planned(quickstart_point, 2, at_once=2), 20, lambda: [Planned(quickstart_point, 2)],
                                ARGV, "at trial 0's settings, 2 at once")
    assert line == ("20 trials; no forecast before the first trial: no run like these has completed on this machine "
                    "yet (the first one records its start-up and evaluations)")
    assert pace_text(30.0, 19, 2, "trial") == \
        "19 trials left, about 5 min on this machine (forecast at the first trial's pace, 30 s)"


def test_a_find_best_stage_line_names_its_stage(capsys):
    from dpo_sweeps.launchers.cost_screen import SweepTiming, gpu_line

    timing = SweepTiming(gpu_line(4, "run"), lambda job: 2, on_cpu=False, stage="probes")
    assert capsys.readouterr().out == ("stage 'probes': 4 runs; no forecast on this machine: they run on its GPUs, "
                                       "and the forecast is of its CPU (a dry run with cluster= the GPU's profile "
                                       "prices them)\n")
    assert timing.paced  # nothing to say at the first run's pace: GPU runs are not forecast here
