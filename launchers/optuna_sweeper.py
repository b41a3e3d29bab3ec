"""`hydra/sweeper=optuna`: an Optuna search with hydra-optuna-sweeper's keys, on Optuna's public API.

The config is conf/hydra/sweeper/optuna.yaml (samplers: conf/hydra/sweeper/sampler/), registered by
hydra_plugins/dpo_sweeps_launchers. It takes hydra-optuna-sweeper's keys (`sampler`, `direction`,
`storage`, `study_name`, `n_trials`, `n_jobs`, `max_failure_rate`, `params`, `custom_search_space`)
and override syntax (launchers/optuna_space.py), so a config written for that plugin runs as it is,
and adds:
- the study in `sqlite:///<sweep dir>/optuna.db` under a fixed name, so the same command again
  continues it; `storage` also takes any RDB URL or `journal:PATH`, and several sweep processes
  naming the same study share it (trial N runs in `<sweep dir>/N`, whichever process asked for it);
- `objectives`: the summary metrics each trial returns (one per `direction`), read from the run's
  metrics; `dpo_sweeps.task.run` itself stays objective-free;
- a setting that no point of the search space reads is refused before the study starts, as a grid
  refuses one none of its points reads (`refuse_unread_settings`, on `SearchSpace.points`);
- each trial is validated before launch: an invalid trial (say, a batch size the ranks do not
  divide) is not run; it gets a failed summary.json (`invalid_config`) and is FAIL in the study;
  a trial predicted not to fit its device is skipped and infeasible to the study (a constraint);
- asynchronous trials: `n_jobs` run at once and a new one starts as soon as any ends
  (launchers/optuna_loop.py), instead of batches that wait for their slowest;
- pruning (`pruner`, `pruner_settings`): each evaluation of a trial is reported to the study and a
  hopeless trial stops there, with summary status `pruned` (dpo_sweeps/train/pruning.py);
- `enqueue_trials`: trials to run first, with the values given;
- on the local launcher, the study's forecast on this machine before its first trial (launchers/optuna_loop.py);
  the dry run with `cluster=` prices the search space's points (on cluster=cpu: what that forecast reads);
- the end-of-sweep screen and a nonzero exit when any trial of this invocation failed.
Works with any launcher (`hydra/launcher=local` or `slurm`); `n_jobs` trials run at a time.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from dpo_sweeps.errors import Failure, FailureKind, RunFailure
from dpo_sweeps.launchers.base import JobNotRun, failed_return, log, task_overrides
from dpo_sweeps.launchers.jobs import (
    SweepJob,
    launch_numbered,
    redact_sweep_config,
    write_multirun_yaml,
    writes_in_sweep_dir,
)
from dpo_sweeps.launchers.outcome import outcome_of, raise_if_failed, sweep_screen
from dpo_sweeps.launchers.preflight import (
    InvalidSweep,
    compose_and_check,
    fit_checks,
    predicted_oom,
    record_predicted_oom,
    refuse_unread_settings,
)
from dpo_sweeps.redaction import redact_text
from dpo_sweeps.rundir.paths import writing
from dpo_sweeps.rundir.summary import Status, Summary, write_summary
from dpo_sweeps.train.pruning import make_pruner
from dpo_sweeps.train.study_storage import share_storage

DIRECTIONS = ("maximize", "minimize")


class ObjectiveUnavailable(Exception):
    """A completed run whose metrics lack a finite value for an objective."""


def objective_values(metrics: Any, objectives: Sequence[str]) -> float | list[float]:
    """The value(s) Optuna records for a trial: one float, or a list for several objectives."""
    if not isinstance(metrics, dict):
        raise ObjectiveUnavailable(f"the run returned {type(metrics).__name__}, not its metrics")
    values = []
    for name in objectives:
        value = metrics.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            available = ", ".join(sorted(k for k, v in metrics.items() if isinstance(v, (int, float))))
            raise ObjectiveUnavailable(f"hydra.sweeper.objectives: '{name}' is {value!r} in this run's metrics "
                                       f"(accepted: a metric with a finite value: {available})")
        values.append(float(value))
    return values[0] if len(values) == 1 else values


@dataclass
class PreparedTrial:
    """A trial composed and checked: its job (None when it could not be composed), and why it will not run."""

    job: SweepJob | None
    refusal: JobReturn | None = None
    skipped: bool = False  # predicted not to fit its device
    # Estimated peak memory minus resources.device_memory_gib (GiB), when the fit check had a limit.
    memory_over_limit_gib: float | None = None


class TrialLauncher(Launcher):
    """Wraps the real launcher: validates each trial before it runs, and turns its metrics into objectives."""

    def __init__(self, inner: Launcher, hydra_context: HydraContext, config: DictConfig, objectives: Sequence[str],
                 skip_predicted_oom: bool):
        self.inner = inner
        self.hydra_context = hydra_context
        self.config = config
        self.objectives = list(objectives)
        self.skip_predicted_oom = skip_predicted_oom
        # (job, JobReturn) of every trial launched (or refused) by this invocation.
        self.history: list[tuple[SweepJob, JobReturn]] = []

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.inner.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def prepare(self, overrides: list[str], num: int) -> PreparedTrial:
        """Compose and check one trial (numbered `num`), and run the fit check."""
        jobs, invalid = compose_and_check(self.hydra_context, self.config, [overrides], num, self.inner)
        if not jobs:
            return self._refuse_invalid(invalid[0])
        [(job, check)] = fit_checks(jobs)
        over = None if check is None else check.estimate_gib - check.limit_gib
        point = predicted_oom(job, check)
        if point is None or not self.skip_predicted_oom:
            return PreparedTrial(job, memory_over_limit_gib=over)
        record_predicted_oom(point)  # its summary says skipped, oom_predicted
        log.warning("trial %d not started: %s", num, point.message)
        refusal = failed_return(job.overrides, JobNotRun(f"oom_predicted: {point.message}"), job)
        self.history.append((job, refusal))
        return PreparedTrial(job, refusal, skipped=True, memory_over_limit_gib=over)

    def _refuse_invalid(self, point: Any) -> PreparedTrial:
        log.warning("trial %d not run: %s: %s", point.num, point.kind, point.message)
        refusal = failed_return(point.overrides, JobNotRun(f"{point.kind}: {point.message}"), point.job)
        if point.job is not None:
            write_summary(point.job.run_dir, Summary(
                Status.FAILED, Failure(FailureKind(point.kind), point.message, started=False),
                task_overrides(point.job), point.job.task_config, {}, written_by="optuna sweeper: not run"))
            self.history.append((point.job, refusal))
        return PreparedTrial(point.job, refusal)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Hydra's Launcher API (one batch, all at once); the sweeper itself runs trials through TrialSlots."""
        prepared = [self.prepare(list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]
        jobs = [p.job for p in prepared if p.refusal is None]
        launched = dict(zip([j.num for j in jobs], launch_numbered(self.inner, jobs)))
        self.history += [(job, launched[job.num]) for job in jobs]
        return [self.with_objectives(launched[p.job.num]) if p.refusal is None else p.refusal for p in prepared]

    def with_objectives(self, ret: JobReturn) -> JobReturn:
        if ret.status != JobStatus.COMPLETED:
            return ret
        out = JobReturn(overrides=ret.overrides, cfg=ret.cfg, hydra_cfg=ret.hydra_cfg, working_dir=ret.working_dir,
                        task_name=ret.task_name, status=JobStatus.COMPLETED)
        try:
            out.return_value = objective_values(ret.return_value, self.objectives)
        except ObjectiveUnavailable as exc:
            out.status = JobStatus.FAILED
            out.return_value = exc
        return out


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def directions_of(direction: Any) -> list[str]:
    """hydra.sweeper.direction: one name or a list, as hydra-optuna-sweeper takes it."""
    names = list(direction) if isinstance(direction, (list, tuple, Sequence)) and not isinstance(direction, str) \
        else [direction]
    names = [str(getattr(d, "name", d)).lower() for d in names]
    bad = [d for d in names if d not in DIRECTIONS]
    if bad or not names:
        raise InvalidSweep(f"hydra.sweeper.direction: {direction!r} (accepted: maximize or minimize, or a list of "
                           "them, one per objective)")
    return names


class OptunaSweeper(Sweeper):
    def __init__(self, sampler: Any, direction: Any = ("maximize",), storage: str | None = None,
                 study_name: str | None = "dpo_sweeps", n_trials: int = 20, n_jobs: int = 1,
                 max_failure_rate: float = 1.0, params: Any = None, custom_search_space: str | None = None,
                 objectives: Sequence[str] | str = ("eval/rewards/accuracies",), dry_run: bool = False,
                 pruner: str = "none", pruner_settings: Any = None, enqueue_trials: Any = None,
                 skip_predicted_oom: bool = True, **unknown: Any) -> None:
        if unknown:
            raise InvalidSweep(
                f"hydra.sweeper.{sorted(unknown)[0]}: not a setting of the Optuna sweeper (accepted: sampler, "
                "direction, storage, study_name, n_trials, n_jobs, max_failure_rate, params, custom_search_space, "
                "objectives, dry_run, pruner, pruner_settings, enqueue_trials, skip_predicted_oom)")
        self.sampler_config = dict(_plain(sampler) or {})
        self.directions = directions_of(_plain(direction))
        self.storage = storage
        self.study_name = study_name or "dpo_sweeps"
        self.n_trials = int(n_trials)
        self.n_jobs = max(1, int(n_jobs))
        if not 0.0 <= float(max_failure_rate) <= 1.0:
            raise InvalidSweep(f"hydra.sweeper.max_failure_rate: {max_failure_rate} (accepted: 0.0 to 1.0)")
        self.max_failure_rate = float(max_failure_rate)
        self.params = _plain(params)
        self.custom_search_space = custom_search_space
        self.objectives = [objectives] if isinstance(objectives, str) else list(_plain(objectives))
        self.dry_run = dry_run
        self.pruner = pruner
        self.pruner_settings = dict(_plain(pruner_settings) or {})
        self.enqueue_trials = [dict(t) for t in _plain(enqueue_trials) or []]
        self.skip_predicted_oom = skip_predicted_oom

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context, task_function=task_function,
                                                           config=config)
        if self.storage:  # a password in it: the jobs get the whole URL through their environment
            share_storage(str(self.storage))
        redact_sweep_config(config)
        self.trials = TrialLauncher(launcher, hydra_context, config, self.objectives, self.skip_predicted_oom)

    def _check(self) -> Any:
        """The settings only this sweeper has, checked before anything runs; returns the pruner."""
        if len(self.directions) != len(self.objectives):
            raise InvalidSweep(
                f"hydra.sweeper.objectives: {len(self.objectives)} ({', '.join(self.objectives)}) but "
                f"hydra.sweeper.direction has {len(self.directions)} ({', '.join(self.directions)}) "
                "(accepted: one direction, maximize or minimize, per objective)")
        try:
            pruner = make_pruner(self.pruner, self.pruner_settings)
        except RunFailure as exc:
            raise InvalidSweep(str(exc)) from None
        if pruner is not None and len(self.objectives) > 1:
            raise InvalidSweep(f"hydra.sweeper.pruner: {self.pruner} with {len(self.objectives)} objectives (Optuna "
                               "cannot prune multi-objective trials) (accepted: pruner=none, or one objective)")
        if pruner is not None and not self.storage:
            raise InvalidSweep(f"hydra.sweeper.pruner: {self.pruner} with hydra.sweeper.storage=null (trials report to "
                               "the study from their own processes) (accepted: a storage URL, e.g. the default "
                               "sqlite:///${hydra.sweep.dir}/optuna.db, or journal:PATH)")
        if pruner is not None and not self.objectives[0].startswith("eval/"):
            raise InvalidSweep(f"hydra.sweeper.pruner: {self.pruner} with objective {self.objectives[0]}, which runs "
                               "report only at the end (accepted: an eval/* objective, reported at every "
                               "train.eval_every)")
        return pruner

    @writes_in_sweep_dir
    def sweep(self, arguments: list[str]) -> None:
        from dpo_sweeps.launchers.optuna_space import SearchSpace, SearchSpaceError

        pruner = self._check()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        try:
            space = SearchSpace.parse(self.params, arguments, self.custom_search_space)
            grid = space.grid() if self.sampler_config.get("_target_", "").endswith("GridSampler") else {}
        except SearchSpaceError as exc:
            raise InvalidSweep(str(exc)) from None
        # Settings no trial would read are refused before the study starts, as a grid refuses its own.
        points = space.points(self.config, grid, self.enqueue_trials)
        refuse_unread_settings(self.hydra_context, self.config, points, self.trials.inner,
                               only_point="at the one point of the search space checked",
                               sample=not space.every_point_checked(grid))
        storage = self._open_storage()
        numbered = numbered_runs(sweep_dir)  # before the count: another worker may be adding trials and runs
        existing = existing_trials(storage, self.study_name)
        if self.dry_run:
            print(f"dry run: study '{self.study_name}' in {self.storage} has {existing} trials; this would run "
                  f"{self.n_trials} more ({self.n_jobs} at a time) into {sweep_dir}/<trial>, searching:\n"
                  + "\n".join(f"  {line}" for line in space.describe())
                  + f"\nobjectives: {', '.join(f'{o} ({d})' for o, d in zip(self.objectives, self.directions))}"
                  + f"\npruner: {self.pruner} {self.pruner_settings or ''}".rstrip())
            self._price(points)
            return
        refuse_foreign_runs(sweep_dir, numbered, existing, self.study_name)
        from dpo_sweeps.launchers.optuna_loop import AsyncStudy, StudySettings  # optuna loads here, when a study runs
        from dpo_sweeps.launchers.optuna_sampler import sampler_factory, trial_seeded_sampler

        name, make, constrained = sampler_factory(self.sampler_config, grid, constrain_memory=self.skip_predicted_oom)
        sampler = trial_seeded_sampler(name, make, self.sampler_config.get("seed"), grid)
        settings = StudySettings(
            study_name=self.study_name, storage=storage, storage_spec=self._storage_spec(),
            directions=self.directions, objective=self.objectives[0], n_trials=self.n_trials,
            max_failure_rate=self.max_failure_rate, pruner=pruner, pruner_spec=(self.pruner, self.pruner_settings),
            constrained=constrained, writes=self._writing_storage)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_multirun_yaml(sweep_dir, self.config)
        log.info("optuna study '%s' (%s, %s): %d earlier trials; running %d more, %d at a time (pruner: %s)",
                 self.study_name, self.storage, name, existing, self.n_trials, self.n_jobs, self.pruner)
        study = AsyncStudy(settings, sampler, space, self.trials, self.config)
        for params in self.enqueue_trials:
            study.enqueue(params)
        outcomes = []
        try:
            study.run(self.n_jobs)
        except KeyboardInterrupt:
            raise SystemExit(f"\nInterrupted: the running trials were stopped; {self.storage} keeps the study "
                             "(their trials stay RUNNING in it). Run the same command again to go on.") from None
        finally:
            try:
                study.save_timeline(sweep_dir / "slots.json")
            except OSError as exc:  # a sweep dir that cannot be written: said once, by what failed first
                log.warning("slots.json not written: %s", exc)
            outcomes = [outcome_of(job, ret) for job, ret in self.trials.history]
            if outcomes:
                hint = "Run the same command again to continue the study with n_trials new trials."
                print(sweep_screen(sweep_dir, outcomes, title="optuna sweep", retry_hint=hint), flush=True)
        study.save_results(sweep_dir / "optimization_results.yaml")
        raise_if_failed(outcomes)

    def _price(self, points: list[list[str]]) -> None:
        """With a cluster named (`cluster=`): the dry run prices the points the search space was checked on,
        as a grid's dry run prices its own (launchers/cost_screen.py). On cluster=cpu that measures this
        machine and times their passes: what the forecast a study prints before its first trial reads."""
        if not self.config.get("cluster"):
            return
        from dpo_sweeps.launchers.cost_screen import predict_jobs
        from dpo_sweeps.launchers.jobs import PointLabels

        jobs, _ = compose_and_check(self.hydra_context, self.config, points, 0, self.trials.inner)
        predictions = predict_jobs(jobs)
        label = PointLabels([job.overrides for job in jobs])
        lines = [f"  {label(job.overrides)}: {predictions[job.num].text()}" for job in jobs if job.num in predictions]
        if lines:
            print(f"predicted, a trial at each of {len(lines)} points of the search space:\n" + "\n".join(lines),
                  flush=True)

    def _storage_spec(self) -> str | None:
        """What trial processes open (trial.json): the storage, redacted where it holds a password."""
        from dpo_sweeps.train.study_storage import storage_spec

        return redact_text(storage_spec(str(self.storage))) if self.storage else None

    def _open_storage(self) -> Any:
        if not self.storage:
            return None
        from dpo_sweeps.train.study_storage import StorageRefused, open_storage

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        if str(self.storage).startswith(("sqlite:///", "journal:")):
            sweep_dir.mkdir(parents=True, exist_ok=True)  # where the default storage lives
        try:
            with self._writing_storage():
                return open_storage(str(self.storage))
        except StorageRefused as exc:
            raise InvalidSweep(str(exc)) from None

    def _writing_storage(self) -> Any:
        """`writing` the storage's file (sqlite's "unable to open database file" names none): in the sweep
        directory hydra.sweep.dir moves it, elsewhere hydra.sweeper.storage."""
        from dpo_sweeps.train.study_storage import storage_file

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        file = storage_file(str(self.storage)) if self.storage else None
        if file is None:
            return contextlib.nullcontext()
        inside = os.path.abspath(file).startswith(os.path.abspath(sweep_dir) + os.sep)
        return writing(file, moved_by="" if inside else "hydra.sweeper.storage")


def existing_trials(storage: Any, study_name: str) -> int:
    """How many trials the study already holds (0 when it does not exist yet)."""
    if storage is None:
        return 0
    import optuna

    summaries = optuna.study.get_all_study_summaries(storage=storage)
    return next((s.n_trials for s in summaries if s.study_name == study_name), 0)


def numbered_runs(sweep_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in sweep_dir.glob("[0-9]*") if p.name.isdigit())


def refuse_foreign_runs(sweep_dir: Path, numbered: list[int], existing: int, study_name: str) -> None:
    """Trial N runs in <sweep dir>/N: numbered runs past the study's trials belong to something else."""
    foreign = [n for n in numbered if n >= existing]
    if foreign:
        raise InvalidSweep(f"hydra.sweep.dir: {sweep_dir} holds run {foreign[0]}, which is not a trial of study "
                           f"'{study_name}' ({existing} trials): trial N runs in <sweep dir>/N (accepted: a new "
                           "hydra.sweep.dir, or the storage and study_name that sweep used)")
