"""The Optuna sweeper's loop: ask for a trial whenever a slot is free, tell the study how each one ended.

Trials run asynchronously (launchers/trial_slots.py) and can be pruned (dpo_sweeps/train/pruning.py);
the loop uses Optuna's public ask-and-tell API only. Trial N of the study runs in `<sweep dir>/N`:
trial numbers are unique in the study, so several sweep processes sharing one study (the same
`hydra.sweeper.storage` and `study_name`) never write into each other's runs, and a continued
study never overwrites an earlier invocation's.

How a trial ends, as the study records it:
- completed: COMPLETE with its objective values;
- stopped by the pruner: PRUNED (summary status `pruned`);
- skipped by the fit check (predicted out of memory): with a sampler that takes constraints (TPE,
  NSGA-II, GP), COMPLETE and infeasible (its memory constraint > 0), with the worst objective
  values of the study's feasible trials, so the sampler learns where the memory boundary is and
  Optuna never counts it best; with other samplers FAIL;
- invalid, failed, or without a finite objective: FAIL (samplers ignore it).
Every trial records its memory constraint (estimated peak minus the device's memory, in GiB) as a
user attribute when the fit check had a limit.

On the local launcher the study says how long its trials will take here before the first one starts, as
a grid sweep does (launchers/cost_screen.py `SweepTiming`): every trial priced at the first one's
settings, the only ones known before the sampler has seen a result; each completed trial's time is
recorded for later forecasts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from omegaconf import OmegaConf

from dpo_sweeps.launchers.cost_screen import SweepTiming
from dpo_sweeps.launchers.jobs import SweepJob
from dpo_sweeps.launchers.optuna_sampler import constraints_per_trial
from dpo_sweeps.launchers.optuna_space import SearchSpace
from dpo_sweeps.launchers.trial_slots import SlotRun, TrialSlots
from dpo_sweeps.rundir.atomic import write_text_atomic
from dpo_sweeps.rundir.summary import Status, read_summary
from dpo_sweeps.train.pruning import TrialLink
from dpo_sweeps.train.study_storage import MEMORY_CONSTRAINT

log = logging.getLogger("launchers")

# The most points of the search space the forecast's worst case prices, before the first trial starts.
FORECAST_POINTS = 8


@dataclass
class StudySettings:
    """What the sweeper resolved from hydra.sweeper.*."""

    study_name: str
    storage: Any  # an Optuna storage object (dpo_sweeps.train.study_storage.open_storage), or None: in memory
    storage_spec: str | None  # what trial processes open (trial.json)
    directions: list[str]
    objective: str  # the first objective: what a pruned trial reports
    n_trials: int
    max_failure_rate: float
    pruner: Any
    pruner_spec: tuple[str, dict]
    constrained: bool  # the sampler takes the memory constraint (constraints_func)
    # Around each write to the storage: names its file when one fails (OptunaSweeper._writing_storage).
    writes: Callable[[], AbstractContextManager] = contextlib.nullcontext


class AsyncStudy:
    def __init__(self, settings: StudySettings, sampler: Any, space: SearchSpace, trials: Any, config: Any):
        import optuna

        self.optuna = optuna
        self.settings = settings
        self.sampler = sampler  # launchers.optuna_sampler.trial_seeded_sampler
        self.space = space
        self.trials = trials  # launchers.optuna_sweeper.TrialLauncher
        self.config = config
        with settings.writes():
            created = optuna.create_study(study_name=settings.study_name, storage=settings.storage, sampler=sampler,
                                          directions=settings.directions, pruner=settings.pruner, load_if_exists=True)
        if [d.name.lower() for d in created.directions] != settings.directions:
            from dpo_sweeps.launchers.preflight import InvalidSweep

            raise InvalidSweep(f"hydra.sweeper.direction: {settings.directions} but study '{settings.study_name}' "
                               f"was created with {[d.name.lower() for d in created.directions]} (accepted: the "
                               "study's directions, or a new study_name or hydra.sweep.dir)")
        # Without storage (hydra.sweeper.storage=null) the study lives in this process only: keep that one.
        self._in_memory = created if settings.storage is None else None
        self.failures = 0
        self.told = 0
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.slots: TrialSlots | None = None
        self.timing: SweepTiming | None = None  # the forecast, said before the first trial starts
        self.asked = 0  # trials asked for by this invocation
        self._forecast_said = False

    def study(self) -> Any:
        """A fresh handle on the study: the storage, which every worker and trial process writes, is the truth."""
        if self._in_memory is not None:
            return self._in_memory
        return self.optuna.load_study(study_name=self.settings.study_name, storage=self.settings.storage,
                                      sampler=self.sampler, pruner=self.settings.pruner)

    def enqueue(self, params: dict) -> None:
        with self.settings.writes():
            self.study().enqueue_trial(params)

    # ------------------------------------------------------------------ the loop
    def run(self, n_jobs: int) -> None:
        """Run n_trials trials, n_jobs at a time; a slot gets its next trial the moment it is free."""
        # Each trial is checked before it starts (dpo_sweeps.checks.validate); import the checker now, not
        # while the first slots wait for it.
        import dpo_sweeps.checks.validate  # noqa: F401

        self.slots = slots = TrialSlots(self.trials.inner, n_jobs)
        self.started_at = time.time()
        try:
            while True:
                while (self.asked < self.settings.n_trials and slots.free and not self._too_many_failures()
                       and not self.sampler.exhausted(self.study())):
                    self.asked += 1
                    self._start_one(slots)
                if not slots.running:
                    break
                self._tell(slots.wait())
        except BaseException:
            slots.cancel()
            raise
        finally:
            self.ended_at = time.time()

    def _too_many_failures(self) -> bool:
        return self.told > 0 and self.failures / self.told > self.settings.max_failure_rate

    def _start_one(self, slots: TrialSlots) -> None:
        TrialState = self.optuna.trial.TrialState
        with self.settings.writes():
            trial = self.study().ask()
        try:
            overrides = self.space.suggest(trial, self.config)
        except Exception as exc:  # the custom search space function, or a distribution Optuna refuses
            log.warning("trial %d: no parameters: %s", trial.number, exc)
            self._finish(trial.number, TrialState.FAIL)
            return
        prepared = self.trials.prepare(overrides, trial.number)
        with self.settings.writes():
            if prepared.memory_over_limit_gib is not None:
                trial.set_user_attr(MEMORY_CONSTRAINT, prepared.memory_over_limit_gib)
            if self.settings.constrained and constraints_per_trial():  # else the sampler's constraints_func reads it
                trial.set_constraint(MEMORY_CONSTRAINT.split("/")[-1], prepared.memory_over_limit_gib or 0.0)
        if prepared.refusal is not None:
            if prepared.skipped and self.settings.constrained:
                self._finish_infeasible(trial.number)
            else:
                self._finish(trial.number, TrialState.FAIL)
            return
        job = prepared.job
        name, settings = self.settings.pruner_spec
        TrialLink(storage=self.settings.storage_spec, study_name=self.settings.study_name, trial_number=trial.number,
                  objective=self.settings.objective, pruner=name, pruner_settings=settings).write(job.run_dir)
        if not self._forecast_said:
            self._forecast_said = True
            self.timing = self._timing(job, trial.number, slots.size)
        log.info("trial %d: %s", trial.number, " ".join(overrides))
        slots.start(job, trial.number)

    def _timing(self, first: SweepJob, number: int, size: int) -> SweepTiming | None:
        """The study's forecast on this machine, at its first trial's settings: on the local launcher only
        (SLURM's jobs run elsewhere, as a grid sweep's); never stops the study."""
        jobs_at_once = getattr(self.trials.inner, "jobs_at_once", None)
        if jobs_at_once is None:
            return None
        try:
            here = jobs_at_once(first)
            return SweepTiming.of_trials(first, 1 + self._to_ask(), None if here is None else min(here, size),
                                         number, lambda: self._costliest_points(first.num))
        except Exception as exc:  # noqa: BLE001 - a forecast never stops a study
            log.warning("no forecast of the trials' time (%s: %s)", type(exc).__name__, exc)
            return None

    def _timed(self, run: SlotRun) -> None:
        try:
            left = self._to_ask() + len(self.slots.running if self.slots is not None else ())
        except Exception as exc:  # noqa: BLE001 - a forecast never stops a study
            log.warning("the trial's time was not recorded for the forecast (%s: %s)", type(exc).__name__, exc)
            return
        self.timing.ended(run.job, run.ended - run.started, left)

    def _to_ask(self) -> int:
        """How many more trials this invocation asks for: n_trials's rest, or fewer points left to a grid."""
        left = self.settings.n_trials - self.asked
        points = self.sampler.points_left(self.study())
        return left if points is None else min(left, points)

    def _costliest_points(self, num: int) -> list[SweepJob]:
        """Points of the search space the forecast's worst case prices: every categorical key's values (up to
        FORECAST_POINTS combinations), intervals and ranges at their top; composed, not checked (a check
        would cost more than the line is worth): one the run would refuse is left out when it is priced."""
        from dpo_sweeps.launchers.jobs import JobCompositionError, compose_job

        jobs = []
        for overrides in self.space.points(self.config, limit=FORECAST_POINTS, at_top=True):
            try:
                jobs.append(compose_job(self.trials.hydra_context, self.config, overrides, num))
            except JobCompositionError:
                continue
        return jobs

    def _tell(self, run: SlotRun) -> None:
        TrialState = self.optuna.trial.TrialState
        self.trials.history.append((run.job, run.job_return))
        if self.timing is not None and run.ended is not None:  # a completed trial's time, for later forecasts
            self._timed(run)
        summary = read_summary(run.job.run_dir)
        if summary is not None and summary.status == Status.PRUNED:
            self._finish(run.tag, TrialState.PRUNED)
            return
        ret = self.trials.with_objectives(run.job_return)
        if ret.status == JobStatus.COMPLETED:
            values = ret.return_value if isinstance(ret.return_value, list) else [ret.return_value]
            self._finish(run.tag, TrialState.COMPLETE, values)
        else:
            failure = summary.failure if summary is not None else None
            log.warning("trial %d failed: %s", run.tag,
                        (failure.message if failure is not None else "") or "no finite objective in its metrics")
            self._finish(run.tag, TrialState.FAIL)

    def _finish_infeasible(self, number: int) -> None:
        """A skipped trial: COMPLETE and infeasible by its constraint, with the worst values of the study's
        feasible trials (0.0 while there are none). TPE and NSGA-II rank an infeasible trial below every
        feasible one whatever its values; GP models them, and weighs its guess by the chance of fitting."""
        TrialState = self.optuna.trial.TrialState
        feasible = [t.values for t in self.study().get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.user_attrs.get(MEMORY_CONSTRAINT, 0.0) <= 0.0]
        worst = [(min if d == "maximize" else max)((v[i] for v in feasible), default=0.0)
                 for i, d in enumerate(self.settings.directions)]
        self.told += 1
        with self.settings.writes():
            self.study().tell(number, values=worst, state=TrialState.COMPLETE)

    def _finish(self, number: int, state: Any, values: list[float] | None = None) -> None:
        self.told += 1
        self.failures += state == self.optuna.trial.TrialState.FAIL
        with self.settings.writes():
            self.study().tell(number, values=values, state=state)

    def save_timeline(self, path: Path) -> None:
        """slots.json: when each trial's job ran (epoch seconds), to see how busy the slots were."""
        if self.slots is None:
            return
        runs = [{"num": r.job.num, "trial": r.tag, "started": r.started, "ended": r.ended}
                for r in self.slots.timeline]
        record = {"n_jobs": self.slots.size, "started": self.started_at, "ended": self.ended_at, "runs": runs}
        write_text_atomic(path, json.dumps(record, indent=1) + "\n")

    # ------------------------------------------------------------------ the result
    def save_results(self, path: Path) -> None:
        """optimization_results.yaml, as hydra-optuna-sweeper writes it: the best trial or the Pareto front
        (of the feasible trials: Optuna leaves out those that broke a constraint)."""
        study = self.study()
        try:
            if len(self.settings.directions) < 2:
                best = study.best_trial
                results: dict[str, Any] = {"name": "optuna", "best_params": best.params, "best_value": best.value}
                log.info("best parameters: %s (value %s)", best.params, best.value)
            else:
                results = {"name": "optuna", "solutions": [{"params": t.params, "values": t.values}
                                                           for t in study.best_trials]}
        except ValueError:  # no trial completed (or none feasible)
            return
        if len(self.settings.directions) > 1 and not results["solutions"]:
            return
        OmegaConf.save(OmegaConf.create(results), path)
