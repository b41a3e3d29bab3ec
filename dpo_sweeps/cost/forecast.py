"""How long runs take on this machine, said before they start: the line a local sweep prints before its
first job and a single run before it trains, "8 runs, about 4 min on this machine (forecast, cluster=cpu;
worst case 6 min)".

A run's time here is its steps and the rest of it (its processes started, torch imported, the model built
and sharded, the evaluations, the summary written):
- the steps: train.max_steps at the step the cost model expects on cluster=cpu (predict.py: this machine's
  profile, the point's pass timings, the lengths of the run's own pairs); the worst case at the top of the
  interval of the step with every row at data.max_length;
- the rest is measured, not modelled: each run that completes here (a local sweep's job, a single run)
  records its time less its steps (`record_run`, under $DPO_SWEEPS_CACHE/cluster/run-rest/), for runs of
  the same model, data, evaluation, ranks and launch (`rest_key`); the forecast takes the median of the last
  RECORDS, the worst case the longest.
Jobs that the machine runs at once share the time (`at_once`). Each distinct plan (the settings the step
depends on) is predicted once. An Optuna study knows one trial's settings before it starts: its line prices
every trial at them and says so, its worst case also priced at points of the search space
(`trials_forecast_text`).

It reads caches only and times nothing: measuring the profile takes tens of seconds (about 40 s on 2 cores,
mostly FSDP's and gloo's costs in fresh processes), which a sweep must not add before its first job. Where
something is missing (the profile: a dry run with cluster=cpu measures it and times the points' passes; the
rest of a run like these: the first run records it) there is no forecast before the first run, and the local
launcher gives one from the first run's own time instead (`pace_text`). A forecast never stops a run: what
goes wrong is said in its line (`forecast_text`).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dpo_sweeps.rundir.atomic import write_json_atomic
from dpo_sweeps.rundir.paths import cache_root

RECORDS = 5  # the rests of the last runs of a kind that a forecast reads


BEFORE_FIRST = "no forecast before the first"  # run, trial


class NoForecast(Exception):
    """What a forecast lacks (one line, said after the run count); `until_first_run`: what the first run (or
    the dry run named) supplies."""

    def __init__(self, reason: str, until_first_run: bool = True):
        super().__init__(reason)
        self.until_first_run = until_first_run


@dataclass(frozen=True)
class Forecast:
    runs: int
    seconds: float
    worst_seconds: float
    provisional: bool  # a timing behind it was taken on a busy machine (cost/load.py)

    worst_basis: str = ""  # what the worst case rests on where that is not the forecast's basis (", the ...")

    def text(self, noun: str = "run", basis: str = "") -> str:
        """The line; `noun`: what it counts ("run", "trial"); `basis`: what the forecast rests on where that
        is not every run's own settings ("at trial 0's settings, 2 at once")."""
        note = "; PROVISIONAL: a timing taken on a busy machine" if self.provisional else ""
        return (f"{counted(self.runs, noun)}, {_minutes(self.seconds)} on this machine (forecast"
                f"{' ' + basis if basis else ''}, cluster=cpu; worst case "
                f"{_minutes(self.worst_seconds).removeprefix('about ')}"
                f"{self.worst_basis}{note})")


def counted(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _minutes(seconds: float) -> str:
    """About so many whole minutes (nearest); under a minute and a half: in seconds, to 10 s."""
    return f"about {max(10, round(seconds, -1)):.0f} s" if seconds < 90 else f"about {round(seconds / 60)} min"


@dataclass(frozen=True)
class Planned:
    """One run to forecast: its typed config, its ranks, and how many runs like it the machine runs at once."""

    config: object  # dpo_sweeps.config.schema.Config
    world_size: int
    at_once: int = 1
    launched: str = "sweep"  # "sweep": a local sweep's job (submitit); "run": a single run's ranks


def forecast(runs: Sequence[Planned], argv: Sequence[str]) -> Forecast:
    """The forecast of `runs` on this machine's CPU; NoForecast says what it lacks (and the dry run of the
    command `argv` that would measure it). What is cheap to find missing is looked for first."""
    from dpo_sweeps.cost.cpu_profile import maybe_measured
    from dpo_sweeps.cost.predict import rank_threads

    root = cache_root()
    if root.exists() and not (root.is_dir() and os.access(root, os.W_OK)):
        raise NoForecast(f"the cache folder DPO_SWEEPS_CACHE={root} is not a writable folder, so this machine's "
                         "timings cannot be kept", until_first_run=False)
    kinds: dict[str, Planned] = {}
    for run in runs:
        kinds.setdefault(rest_key(run.config, run.world_size, run.launched), run)
    for key, run in kinds.items():
        if not recorded_rests(key):
            raise NoForecast("no run like these has completed on this machine yet (the first one records its "
                             "start-up and evaluations)")
        if not maybe_measured(rank_threads(run.config)):
            raise NoForecast(f"this machine's CPU is not measured yet (once, about 40 s on 2 cores: "
                             f"{timing_command(argv)})")
    predicted: dict[str, object] = {}  # by the settings the step depends on: one prediction per plan
    seconds = worst = 0.0
    provisional = False
    for run in runs:
        key, plan = rest_key(run.config, run.world_size, run.launched), _step_key(run)
        if plan not in predicted:
            predicted[plan] = _predicted(run, argv)
        prediction, rests = predicted[plan], recorded_rests(key)
        steps = run.config.probe.steps or run.config.train.max_steps
        worst_step = prediction.worst_step_time_s or prediction.step_time_s
        seconds += (steps * prediction.step_time_s.value + statistics.median(rests)) / run.at_once
        worst += (steps * worst_step.high + max(rests)) / run.at_once
        provisional |= prediction.provisional
    return Forecast(len(runs), seconds, worst, provisional)


def _step_key(run: Planned) -> str:
    """What a run's step time depends on: the settings its fit check reads (not its lr, beta or steps)."""
    from dpo_sweeps.parallel.fit import fit_key

    return fit_key(_plain(run.config), run.world_size)


def _predicted(run: Planned, argv: Sequence[str]):
    """The cost model's prediction of one run on this machine's cached profile and pass timings (predict.py).
    The fit estimator's process builds the model's shape while this one reads the data's lengths."""
    from dpo_sweeps.cost.data_lengths import data_lengths
    from dpo_sweeps.cost.predict import predict_config, this_cpu_profile
    from dpo_sweeps.errors import DataError, InvalidConfig
    from dpo_sweeps.parallel.fit import measure_in_background

    cfg = run.config
    profile = this_cpu_profile(cfg)
    if profile is None:
        raise NoForecast(f"this machine's CPU is not measured yet (once, about 40 s on 2 cores: "
                         f"{timing_command(argv)})")
    measure_in_background(cfg.model)
    try:
        lengths = data_lengths(cfg, run.world_size)
    except (DataError, InvalidConfig, OSError, ValueError):
        lengths = None  # the worst case alone (predict.py says so)
    try:
        return predict_config(cfg, profile, run.world_size, time_passes=False, lengths=lengths,
                              read_data=lengths is not None)
    except ValueError as exc:
        if "passes were not timed" not in str(exc):  # predict.py's _Timings: not cached
            raise
        raise NoForecast(f"the passes of these runs are not timed on this machine yet ({timing_command(argv)} "
                         "times them)") from None


def forecast_text(runs: Sequence[Planned], argv: Sequence[str], noun: str = "run", basis: str = "") -> str:
    """The forecast's line, or the line saying there is none and why; never raises. `argv`: the command's
    arguments (sys.argv[1:]); `noun` and `basis`: Forecast.text's."""
    count = counted(len(runs), noun)
    try:
        return forecast(runs, argv).text(noun, basis)
    except NoForecast as exc:
        return f"{count}; {f'{BEFORE_FIRST} {noun}' if exc.until_first_run else 'no forecast'}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a forecast that fails never stops a run
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"{count}; no forecast ({type(exc).__name__}: {first})"


def trials_forecast_text(first: Planned, trials: int, others: Callable[[], Sequence[Planned]],
                         argv: Sequence[str], basis: str, first_name: str = "the first trial's settings") -> str:
    """A study's line: `trials` trials, each at the settings of the first (`first`: the only trial asked for
    before the study starts), the worst case the costliest of it and of `others()` (points of the search
    space, made only where the first has a forecast) at their worst, those that can be priced here; never
    raises."""
    try:
        expected = forecast([first] * trials, argv)
    except Exception:  # noqa: BLE001 - forecast_text says why
        return forecast_text([first] * trials, argv, "trial", basis)
    worst, priced = expected.worst_seconds, 0
    try:
        points = others()
    except Exception:  # noqa: BLE001 - the worst case at the first trial's settings alone
        points = []
    for other in points:
        try:
            worst = max(worst, forecast([other] * trials, argv).worst_seconds)
            priced += 1
        except Exception:  # noqa: BLE001, S112 - a point not timed here (or not valid) is left out of the worst case
            continue
    where = f", the costliest of {first_name} and {counted(priced, 'point')} of the search space" if priced else ""
    return replace(expected, worst_seconds=worst, worst_basis=where).text("trial", basis)


def timing_command(argv: Sequence[str]) -> str:
    """The dry run of the command `argv` on cluster=cpu: it measures this machine and times the runs' passes."""
    import shlex

    kept = [a for a in argv if a not in ("-m", "--multirun")
            and not a.startswith(("cluster=", "hydra.sweeper.dry_run="))]
    return shlex.join(["python", "-m", "dpo_sweeps", "-m", *kept, "cluster=cpu", "hydra.sweeper.dry_run=true"])


def pace_text(first_s: float, runs_left: int, at_once: int, noun: str = "run") -> str:
    """The forecast after a sweep's first run where there was none before it: the rest at its pace."""
    return (f"{counted(runs_left, noun)} left, {_minutes(runs_left * first_s / at_once)} "
            f"on this machine (forecast at the first {noun}'s pace, {first_s:.0f} s)")


def rest_key(cfg, world_size: int, launched: str) -> str:
    """What the rest of a run's time depends on: the model, the data, how much it evaluates and saves, its
    ranks and how they are started (not its sharding, precision or loss, which change its steps), and this
    machine."""
    train = cfg.train
    kept = [socket.gethostname(), launched, world_size, _plain(cfg.model), _plain(cfg.data), train.max_steps,
            train.eval_every, train.eval_max_pairs, train.save_model, cfg.probe.steps]
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _plain(section) -> object:
    from dataclasses import asdict, is_dataclass

    return asdict(section) if is_dataclass(section) else section


def _rest_file(key: str) -> Path:
    return cache_root() / "cluster" / "run-rest" / f"{key}.json"


def recorded_rests(key: str) -> list[float]:
    try:
        found = json.loads(_rest_file(key).read_text())
        return [float(x) for x in found["rest_s"]][-RECORDS:]
    except (OSError, ValueError, TypeError, KeyError):
        return []


def record_run(cfg, world_size: int, launched: str, took_s: float, steps: int, step_s: float) -> None:
    """Record a completed run's time less its steps (`took_s`: from its start to its end, as the launcher or
    the command saw it). A cache that cannot be written records nothing."""
    key = rest_key(cfg, world_size, launched)
    rests = recorded_rests(key) + [max(0.0, took_s - steps * step_s)]
    try:
        write_json_atomic(_rest_file(key), {"rest_s": rests[-RECORDS:]})
    except OSError:
        pass


def print_run_forecast(cfg, run_dir: Path) -> None:
    """A single run's forecast, printed before its ranks start (app.py calls it once); its time is recorded
    when the process ends (the run's end is run_end.py's), if it completed, for the next forecast."""
    import atexit
    import sys
    import time

    from dpo_sweeps.parallel.fit import stop_measuring

    print(forecast_text([Planned(cfg, cfg.world_size, launched="run")], sys.argv[1:]), flush=True)
    stop_measuring()  # the forecast was the run's last question for the estimator process: its memory goes
    started, wall_started = time.monotonic(), time.time()

    def record() -> None:
        from dpo_sweeps.rundir.summary import read_summary

        try:
            summary = read_summary(run_dir)
            if summary is None or not summary.completed or summary.resumed_from_step is not None \
                    or (run_dir / "summary.json").stat().st_mtime < wall_started:
                return
            steps, step_s = summary.metrics.get("steps"), summary.metrics.get("perf/step_time_s")
            if isinstance(steps, int) and isinstance(step_s, (int, float)):
                record_run(cfg, cfg.world_size, "run", time.monotonic() - started, steps, step_s)
        except Exception:  # noqa: BLE001, S110 - a forecast never fails a run, nor its exit
            pass

    atexit.register(record)
