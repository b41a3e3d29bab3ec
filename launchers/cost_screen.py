"""What a sweep will cost, before it starts: each point's predicted step time, tokens/s per device, MFU
and device-hours on the cluster it names (`cluster=`, dpo_sweeps/cost/), beside the fit check's verdict,
and the sweep's total. The dry run lists them, for the points that have run too (with the step they
measured beside the prediction where they ran on the cluster's hardware); a real sweep prints the total
before its first job. A local sweep also says how long its jobs take on this machine (`forecast_line`,
cost/forecast.py), and records each completed job's time for the next forecasts (`SweepTiming`: a grid
sweep's launch, each find_best stage, an Optuna study)."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dpo_sweeps.launchers.jobs import SweepJob
from dpo_sweeps.launchers.preflight import CheckedConfig
from dpo_sweeps.rundir.summary import read_summary

log = logging.getLogger("launchers")


def predict_jobs(jobs: Sequence[SweepJob], checks: dict[int, Any] | None = None) -> dict[int, Any]:
    """Each job's Prediction by job number, for the jobs whose config names a cluster; one prediction per
    distinct config (`fit_key`: the settings the cost reads are the estimate's, and train.max_steps). `checks`: the jobs' fit
    checks by number, whose memory estimate the prediction shows."""
    from dpo_sweeps.cost.predict import predict_config, profile_of_config
    from dpo_sweeps.parallel.fit import fit_key

    checked = CheckedConfig()
    cache: dict[str, Any] = {}
    out: dict[int, Any] = {}
    for job in jobs:
        if not job.task_config.get("cluster"):
            continue
        # The estimate's settings, and the steps the device-hours count (the fit check ignores them).
        key = fit_key(job.task_config, job.world_size) + str(job.task_config["train"]["max_steps"])
        if key not in cache:
            cfg = checked.of(job.task_config)
            check = (checks or {}).get(job.num)
            try:
                cache[key] = predict_config(cfg, profile_of_config(cfg), job.world_size,
                                            check.estimate_gib if check is not None else None)
            except (OSError, ValueError) as exc:  # e.g. a hub model not in the local cache
                log.warning("#%d: no cost prediction (%s)", job.num, str(exc).splitlines()[0] if str(exc) else exc)
                cache[key] = None
        if cache[key] is not None:
            out[job.num] = cache[key]
    return out


def total_line(predictions: dict[int, Any]) -> str | None:
    if not predictions:
        return None
    from dpo_sweeps.cost.predict import total_text

    return total_text(list(predictions.values()))


def forecast_line(jobs: Sequence[SweepJob], at_once: Callable[[SweepJob], int], noun: str = "run",
                  basis: str = "") -> str:
    """How long the jobs take on this machine's CPU, run `at_once(job)` at a time (cost/forecast.py), or why
    there is no forecast; never raises: a forecast never stops a sweep. `noun`, `basis`: Forecast.text's."""
    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.cost.forecast import Planned, counted, forecast_text

    try:  # Config.of, as the run reads it (DPO_SWEEPS_SMOKE's cut included)
        runs = [Planned(Config.of(job.task_config), job.world_size, at_once(job)) for job in jobs]
    except Exception as exc:  # noqa: BLE001
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"{counted(len(jobs), noun)}; no forecast ({type(exc).__name__}: {first})"
    return forecast_text(runs, sys.argv[1:], noun, basis)


class SweepTiming:
    """A local sweep's forecast on this machine, said before its first job starts (cost/forecast.py), or after
    its first completed run where nothing could be said before; and each completed run's time recorded for
    the next forecasts. A grid sweep's launch (launchers/local.py: a find_best stage's too) and an Optuna
    study (optuna_loop.py) each make one. `noun`: what the lines count ("run", "trial")."""

    def __init__(self, line: str, at_once: Callable[[SweepJob], int], on_cpu: bool = True, noun: str = "run",
                 stage: str = ""):
        from dpo_sweeps.cost.forecast import BEFORE_FIRST

        self.at_once, self.on_cpu, self.noun = at_once, on_cpu, noun
        self.prefix = f"stage '{stage}': " if stage else ""
        self.paced = BEFORE_FIRST not in line  # said already, or nothing to say after the first run
        print(self.prefix + line, flush=True)

    @classmethod
    def of_jobs(cls, jobs: Sequence[SweepJob], on_gpus: list[bool], at_once: Callable[[SweepJob], int],
                stage: str = "") -> SweepTiming:
        """The forecast of a launch's jobs, each at its own settings; `stage`: the find_best stage they are."""
        if any(on_gpus):
            return cls(gpu_line(len(jobs), "run"), at_once, on_cpu=False, stage=stage)
        return cls(forecast_line(jobs, at_once), at_once, stage=stage)

    @classmethod
    def of_trials(cls, first: SweepJob, trials: int, at_once: int | None, tag: Any,
                  others: Callable[[], Sequence[SweepJob]] = tuple) -> SweepTiming:
        """The forecast of a study's `trials`, each priced at the settings of its first (`first`, trial `tag`):
        the rest are not asked for yet; the worst case also at `others()`, points of the search space, composed
        only where the first has a forecast. `at_once`: how many run at once here; None: on the GPUs."""
        if at_once is None:
            return cls(gpu_line(trials, "trial"), lambda job: 1, on_cpu=False, noun="trial")
        from dpo_sweeps.config.schema import Config
        from dpo_sweeps.cost.forecast import Planned, trials_forecast_text

        def planned(job: SweepJob) -> Planned | None:
            try:  # Config.of, as the run reads it (DPO_SWEEPS_SMOKE's cut included)
                return Planned(Config.of(job.task_config), job.world_size, at_once)
            except Exception:  # noqa: BLE001 - a point the run would refuse: not priced
                return None

        basis = f"at trial {tag}'s settings, {at_once} at once"
        first_run = planned(first)
        if first_run is None:  # forecast_line says why
            line = forecast_line([first] * trials, lambda job: at_once, "trial", basis)
        else:
            line = trials_forecast_text(first_run, trials,
                                        lambda: [p for job in others() if (p := planned(job)) is not None],
                                        sys.argv[1:], basis, f"trial {tag}'s settings")
        return cls(line, lambda job: at_once, noun="trial")

    def ended(self, job: SweepJob, took_s: float, left: int) -> None:
        """A run of the sweep ended, `took_s` after it started, `left` runs to go: its time recorded if it
        completed, and the first one's pace said where there was no forecast before it."""
        if not self.on_cpu:
            return
        try:
            summary = read_summary(job.run_dir)
            metrics = summary.metrics if summary is not None and summary.completed else {}
            steps, step_s = metrics.get("steps"), metrics.get("perf/step_time_s")
            if summary is None or summary.resumed_from_step is not None or not isinstance(steps, int) \
                    or not isinstance(step_s, (int, float)):
                return
            from dpo_sweeps.config.schema import Config
            from dpo_sweeps.cost.forecast import pace_text, record_run

            record_run(Config.of(job.task_config), job.world_size, "sweep", took_s, steps, step_s)
            if not self.paced and left:
                self.paced = True
                print(self.prefix + pace_text(took_s, left, self.at_once(job), self.noun), flush=True)
        except Exception as exc:  # noqa: BLE001 - a forecast never stops a sweep
            log.warning("the %s's time was not recorded for the forecast (%s: %s)", self.noun, type(exc).__name__, exc)


def gpu_line(count: int, noun: str) -> str:
    from dpo_sweeps.cost.forecast import counted

    return (f"{counted(count, noun)}; no forecast on this machine: they run on its GPUs, and the forecast is of "
            "its CPU (a dry run with cluster= the GPU's profile prices them)")


def measured_beside(job: SweepJob, run_dir: Path, prediction: Any) -> str:
    """What a completed point's run measured, beside its prediction: its step time and the prediction's
    error where it ran on the hardware the cluster profile describes (cluster=cpu: a CPU run on this
    machine; a GPU profile: a GPU run predicted on that profile, i.e. on that GPU), else where it ran."""
    from dpo_sweeps.rundir.summary import read_summary

    summary = read_summary(run_dir)
    measured = summary.metrics.get("perf/step_time_s") if summary is not None else None
    if measured is None:
        return "ran (no measured step time)"
    cluster = job.task_config["cluster"]
    if cluster.get("measured"):
        nodes = set((summary.layout or {}).get("nodes") or [])
        same = summary.device_kind == "cpu" and nodes <= {socket.gethostname()} and bool(nodes)
    else:
        same = summary.device_kind == "gpu" and \
            summary.metrics.get("perf/step_time_predicted_profile") == cluster.get("name")
    if not same:
        where = summary.device_kind or "unknown hardware"
        return f"ran on other hardware ({where}): measured {measured:.3g} s there"
    step = prediction.step_time_s
    inside = "inside" if step.low <= measured <= step.high else "OUTSIDE"
    return (f"ran on this hardware: measured {measured:.3g} s, {100 * (step.value - measured) / measured:+.0f}% "
            f"off, {inside} the interval")
