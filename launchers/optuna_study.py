"""The Optuna sweeper's loop: ask for a trial whenever a slot is free, tell the study how each one ended.

The search space, sampler, storage and trial count come from hydra-optuna-sweeper's configuration
(its `OptunaSweeperImpl`, which parses `hydra.sweeper.params` and the command line); the loop is
ours, so that trials run asynchronously (launchers/trial_slots.py) and can be pruned
(dpo_sweeps/train/pruning.py). A trial the pruner stopped ends with summary status `pruned` and is told
to the study as PRUNED, with its last reported value.

Optuna's cached RDB storage keeps its own copy of the trials a study object created and does not
see what trial processes write (intermediate values, states), so each ask and tell goes through a
fresh study object: the storage is the source of truth.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from omegaconf import OmegaConf

from dpo_sweeps.rundir.outputs import read_summary
from dpo_sweeps.train.pruning import TrialLink
from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
from launchers.trial_slots import SlotRun, TrialSlots

log = logging.getLogger("launchers")


def absolute_storage(storage: str) -> str:
    """A sqlite URL with an absolute path: trial processes may start in another working directory."""
    prefix = "sqlite:///"
    if storage.startswith(prefix) and not storage[len(prefix):].startswith("/"):
        return prefix + os.path.abspath(storage[len(prefix):])
    return storage


class AsyncStudy:
    def __init__(self, impl: Any, arguments: Sequence[str], directions: list[str], pruner: Any, trials: Any,
                 objective: str, pruner_spec: tuple[str, dict]):
        import optuna

        self.optuna = optuna
        self.impl = impl
        self.trials = trials  # launchers.optuna_sweeper.TrialLauncher
        self.directions = directions
        self.pruner = pruner
        self.objective = objective
        self.pruner_spec = pruner_spec
        self.storage = absolute_storage(str(impl.storage)) if impl.storage else None
        # One database engine for all the fresh study handles below (each has its own, empty cache).
        self._backend = optuna.storages.RDBStorage(self.storage) if self.storage else None
        self.space, self.fixed = self._search_space(list(arguments))
        created = optuna.create_study(study_name=impl.study_name, storage=self._backend, sampler=self.sampler,
                                      directions=directions, pruner=pruner, load_if_exists=True)
        # Without storage (hydra.sweeper.storage=null) the study lives in this process only: keep that one.
        self._in_memory = created if self._backend is None else None
        self.failures = 0
        self.told = 0
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.slots: TrialSlots | None = None

    def _search_space(self, arguments: list[str]) -> tuple[dict, dict]:
        """hydra.sweeper.params and the command line's sweep overrides, as Optuna distributions."""
        impl = self.impl
        impl._process_searchspace_config()
        space, fixed = create_params_from_overrides(impl._parse_sweeper_params_config() + arguments)
        space = {**(impl.search_space_distributions or {}), **space}
        for name in fixed:
            space.pop(name, None)
        self.sampler = impl.sampler
        self.n_trials = impl.n_trials
        if isinstance(self.sampler, functools.partial) and self.sampler.func == self._grid_sampler():
            grid = {name: impl._to_grid_sampler_choices(dist) for name, dist in space.items()}
            self.sampler = self.sampler(grid)
            size = 1
            for choices in grid.values():
                size *= len(choices)
            self.n_trials = min(self.n_trials, size)
        return space, fixed

    def _grid_sampler(self) -> Any:
        return self.optuna.samplers.GridSampler

    def study(self) -> Any:
        if self._in_memory is not None:
            return self._in_memory
        return self.optuna.load_study(study_name=self.impl.study_name, storage=self._backend, sampler=self.sampler,
                                      pruner=self.pruner)

    def enqueue(self, params: dict) -> None:
        self.study().enqueue_trial(params)

    # ------------------------------------------------------------------ the loop
    def run(self, n_jobs: int) -> None:
        """Run n_trials trials, n_jobs at a time; a slot gets its next trial the moment it is free."""
        # Each trial is checked before it starts (dpo_sweeps.config.validate); import the checker now, not
        # while the first slots wait for it.
        import dpo_sweeps.config.validate  # noqa: F401

        self.slots = slots = TrialSlots(self.trials.inner, n_jobs)
        self.started_at = time.time()
        asked = 0
        try:
            while True:
                while asked < self.n_trials and slots.free and not self._too_many_failures():
                    asked += 1
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
        return self.told > 0 and self.failures / self.told > self.impl.max_failure_rate

    def _start_one(self, slots: TrialSlots) -> None:
        trial = self.study().ask()
        overrides = list(self.impl._configure_trials([trial], self.space, self.fixed)[0])
        num = self.impl.job_idx
        self.impl.job_idx += 1
        job, refusal = self.trials.prepare(overrides, num)
        if refusal is not None:
            self._finish(trial.number, self.optuna.trial.TrialState.FAIL)
            return
        if self.pruner is not None:
            name, settings = self.pruner_spec
            # Optuna 2.10 has no public accessor for the storage id a trial process reports under.
            TrialLink(storage=self.storage, study_name=self.impl.study_name, trial_id=trial._trial_id,
                      trial_number=trial.number, objective=self.objective, pruner=name,
                      pruner_settings=settings).write(job.run_dir)
        log.info("trial %d -> #%d: %s", trial.number, num, " ".join(overrides))
        slots.start(job, trial.number)

    def _tell(self, run: SlotRun) -> None:
        TrialState = self.optuna.trial.TrialState
        self.trials.history.append((run.job, run.job_return))
        summary = read_summary(run.job.run_dir) or {}
        if summary.get("status") == "pruned":
            self._finish(run.tag, TrialState.PRUNED)
            return
        ret = self.trials.with_objectives(run.job_return)
        if ret.status == JobStatus.COMPLETED:
            values = ret.return_value if isinstance(ret.return_value, list) else [ret.return_value]
            self._finish(run.tag, TrialState.COMPLETE, values)
        else:
            log.warning("trial %d failed: %s", run.tag, ret._return_value)
            self._finish(run.tag, TrialState.FAIL)

    def _finish(self, number: int, state: Any, values: list[float] | None = None) -> None:
        self.told += 1
        self.failures += state == self.optuna.trial.TrialState.FAIL
        self.study().tell(number, values=values, state=state)

    def save_timeline(self, path: Path) -> None:
        """slots.json: when each trial's job ran (epoch seconds), to see how busy the slots were."""
        if self.slots is None:
            return
        runs = [{"num": r.job.num, "trial": r.tag, "started": r.started, "ended": r.ended}
                for r in self.slots.timeline]
        record = {"n_jobs": self.slots.size, "started": self.started_at, "ended": self.ended_at, "runs": runs}
        path.write_text(json.dumps(record, indent=1) + "\n")

    # ------------------------------------------------------------------ the result
    def save_results(self, path: Path) -> None:
        """optimization_results.yaml, as hydra-optuna-sweeper writes it: the best trial or the Pareto front."""
        study = self.study()
        done = [t for t in study.trials if t.state == self.optuna.trial.TrialState.COMPLETE]
        if not done:
            return
        if len(self.directions) < 2:
            best = study.best_trial
            results: dict[str, Any] = {"name": "optuna", "best_params": best.params, "best_value": best.value}
            log.info("best parameters: %s (value %s)", best.params, best.value)
        else:
            results = {"name": "optuna", "solutions": [{"params": t.params, "values": t.values}
                                                       for t in study.best_trials]}
        OmegaConf.save(OmegaConf.create(results), path)
