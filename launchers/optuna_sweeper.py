"""`hydra/sweeper=optuna`: hydra-optuna-sweeper, kept in the sweep directory and checked before launch.

`OptunaSweeperConf` below replaces the plugin's own `hydra/sweeper=optuna` config (same keys, plus
`objectives` and `dry_run`, and defaults that suit this project; registered by
hydra_plugins/dpo_sweeps_launchers). What this adds to the plugin's sweeper:
- the study lives in `sqlite:///<sweep dir>/optuna.db` under a fixed name, so running the same
  command again (same `hydra.sweep.dir`) continues the same study; run directories are numbered
  after the study's existing trials, so a second invocation never overwrites the first's runs;
- `objectives` names the summary metrics each trial returns (one per `direction`), read from the
  run's metrics; `dpo_sweeps.app.run` itself stays objective-free;
- each trial is validated before launch: an invalid trial (say, a batch size the ranks do not
  divide) is not run; it gets a failed summary.json (`invalid_config`) and is told to the study as
  FAIL, like a run that fails. Optuna's samplers ignore failed trials, and `max_failure_rate: 1.0`
  keeps the study going;
- asynchronous trials: `n_jobs` run at once and a new one starts as soon as any ends
  (launchers/optuna_study.py), instead of batches that wait for their slowest;
- pruning (`pruner`, `pruner_settings`): each evaluation of a trial is reported to the study and a
  hopeless trial stops there, with summary status `pruned` (dpo_sweeps/train/pruning.py);
- `enqueue_trials`: trials to run first, with the values given;
- the end-of-sweep screen and a nonzero exit when any trial of this invocation failed.
Works with any launcher (`hydra/launcher=local` or `slurm`); `n_jobs` trials run at a time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf

from dpo_sweeps.errors import Failure, FailureKind, RunFailure
from dpo_sweeps.rundir.outputs import write_summary
from dpo_sweeps.train.pruning import make_pruner
from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf as PluginOptunaSweeperConf
from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper as PluginOptunaSweeper
from launchers.base import JobNotRun, failed_return, log, task_overrides
from launchers.grid_sweeper import launch_numbered
from launchers.jobs import SweepJob
from launchers.outcome import outcome_of, raise_if_failed, sweep_screen
from launchers.preflight import InvalidSweep, compose_and_check, predicted_ooms, record_predicted_oom


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


class TrialLauncher(Launcher):
    """Wraps the real launcher: validates each trial before it runs, and turns its metrics into objectives."""

    def __init__(self, inner: Launcher, hydra_context: HydraContext, config: DictConfig, objectives: Sequence[str]):
        self.inner = inner
        self.hydra_context = hydra_context
        self.config = config
        self.objectives = list(objectives)
        # (job, JobReturn) of every trial launched (or refused) by this invocation.
        self.history: list[tuple[SweepJob, JobReturn]] = []
        self.skip_predicted_oom = True

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.inner.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def prepare(self, overrides: list[str], num: int) -> tuple[SweepJob | None, JobReturn | None]:
        """Compose and check one trial: (the job to run, None), or (job or None, its refusal)."""
        jobs, invalid = compose_and_check(self.hydra_context, self.config, [overrides], num, self.inner)
        if jobs and self.skip_predicted_oom:
            jobs, unfit = predicted_ooms(jobs)
            for point in unfit:  # told to the study as FAIL; its summary says skipped, oom_predicted
                record_predicted_oom(point)
                log.warning("trial #%d not started: %s", num, point.message)
                refusal = failed_return(point.job.overrides, JobNotRun(f"oom_predicted: {point.message}"), point.job)
                self.history.append((point.job, refusal))
                return point.job, refusal
        if jobs:
            return jobs[0], None
        point = invalid[0]
        log.warning("trial #%d not run: %s: %s", point.num, point.kind, point.message)
        refusal = failed_return(point.overrides, JobNotRun(f"{point.kind}: {point.message}"), point.job)
        if point.job is not None:
            write_summary(point.job.run_dir, status="failed", failure=Failure(FailureKind(point.kind), point.message).brief(),
                          overrides=task_overrides(point.job), config=point.job.task_config, metrics={},
                          extra={"written_by": "optuna sweeper: not run"})
            self.history.append((point.job, refusal))
        return point.job, refusal

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Hydra's Launcher API (one batch, all at once); the sweeper itself runs trials through TrialSlots."""
        prepared = [self.prepare(list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]
        jobs = [job for job, refusal in prepared if refusal is None]
        launched = dict(zip([j.num for j in jobs], launch_numbered(self.inner, jobs)))
        self.history += [(job, launched[job.num]) for job in jobs]
        return [self.with_objectives(launched[job.num]) if refusal is None else refusal for job, refusal in prepared]

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


class OptunaSweeper(PluginOptunaSweeper):
    def __init__(self, objectives: Sequence[str] | str = ("eval/rewards/accuracies",), dry_run: bool = False,
                 pruner: str = "none", pruner_settings: dict | None = None,
                 enqueue_trials: Sequence[dict] | None = None, skip_predicted_oom: bool = True,
                 **plugin_params: Any) -> None:
        super().__init__(**plugin_params)
        self.objectives = [objectives] if isinstance(objectives, str) else list(objectives)
        self.dry_run = dry_run
        self.pruner = pruner
        self.pruner_settings = dict(OmegaConf.to_container(pruner_settings) if isinstance(pruner_settings, DictConfig)
                                    else pruner_settings or {})
        trials = OmegaConf.to_container(enqueue_trials) if isinstance(enqueue_trials, ListConfig) else enqueue_trials
        self.enqueue_trials = [dict(t) for t in trials or []]
        self.skip_predicted_oom = skip_predicted_oom

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.config = config
        self.trials = TrialLauncher(self.sweeper.launcher, hydra_context, config, self.objectives)
        self.trials.skip_predicted_oom = self.skip_predicted_oom
        self.sweeper.launcher = self.trials

    def _check(self, directions: list[str]) -> Any:
        """The settings only this sweeper has, checked before anything runs; returns the pruner."""
        if len(directions) != len(self.objectives):
            raise InvalidSweep(
                f"hydra.sweeper.objectives: {len(self.objectives)} ({', '.join(self.objectives)}) but "
                f"hydra.sweeper.direction has {len(directions)} ({', '.join(map(str, directions))}) "
                "(accepted: one direction, maximize or minimize, per objective)")
        try:
            pruner = make_pruner(self.pruner, self.pruner_settings)
        except RunFailure as exc:
            raise InvalidSweep(str(exc)) from None
        if pruner is not None and len(self.objectives) > 1:
            raise InvalidSweep(f"hydra.sweeper.pruner: {self.pruner} with {len(self.objectives)} objectives (Optuna "
                               "cannot prune multi-objective trials) (accepted: pruner=none, or one objective)")
        if pruner is not None and not self.sweeper.storage:
            raise InvalidSweep(f"hydra.sweeper.pruner: {self.pruner} with hydra.sweeper.storage=null (trials report to "
                               "the study from their own processes) (accepted: a storage URL, e.g. the default "
                               "sqlite:///${hydra.sweep.dir}/optuna.db)")
        if pruner is not None and not self.objectives[0].startswith("eval/"):
            raise InvalidSweep(f"hydra.sweeper.pruner: {self.pruner} with objective {self.objectives[0]}, which runs "
                               "report only at the end (accepted: an eval/* objective, reported at every "
                               "train.eval_every)")
        return pruner

    def sweep(self, arguments: list[str]) -> None:
        impl = self.sweeper
        directions = impl._get_directions()
        pruner = self._check(directions)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        existing = existing_trials(impl.storage, impl.study_name)
        impl.job_idx = max([existing] + [int(p.name) + 1 for p in sweep_dir.iterdir() if p.name.isdigit()])
        if self.dry_run:
            print(f"dry run: study '{impl.study_name}' in {impl.storage} has {existing} trials; this would run "
                  f"{impl.n_trials} more ({impl.n_jobs} at a time) into {sweep_dir}/<trial>, searching:\n"
                  + "\n".join(f"  {k}: {v}" for k, v in (impl.params or {}).items())
                  + f"\nobjectives: {', '.join(f'{o} ({d})' for o, d in zip(self.objectives, directions))}"
                  + f"\npruner: {self.pruner} {self.pruner_settings or ''}".rstrip())
            return
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        log.info("optuna study '%s' (%s): %d earlier trials; running %d more, %d at a time (pruner: %s)",
                 impl.study_name, impl.storage, existing, impl.n_trials, impl.n_jobs, self.pruner)
        from launchers.optuna_study import AsyncStudy  # optuna loads here, when a study runs

        study = AsyncStudy(impl, arguments, directions, pruner, self.trials, self.objectives[0],
                           (self.pruner, self.pruner_settings))
        for params in self.enqueue_trials:
            study.enqueue(params)
        try:
            study.run(max(1, int(impl.n_jobs)))
        except KeyboardInterrupt:
            raise SystemExit(f"\nInterrupted: the running trials were stopped; {sweep_dir}/optuna.db keeps the "
                             "study (their trials stay RUNNING in it). Run the same command again to go on.") from None
        finally:
            study.save_timeline(sweep_dir / "slots.json")
            outcomes = [outcome_of(job, ret) for job, ret in self.trials.history]
            if outcomes:
                hint = "Run the same command again to continue the study with n_trials new trials."
                print(sweep_screen(sweep_dir, outcomes, title="optuna sweep", retry_hint=hint), flush=True)
        study.save_results(sweep_dir / "optimization_results.yaml")
        raise_if_failed(outcomes)


def existing_trials(storage: Any, study_name: str | None) -> int:
    """How many trials the study already holds (0 when it does not exist yet)."""
    if storage is None or study_name is None:
        return 0
    import optuna

    try:
        summaries = optuna.study.get_all_study_summaries(storage=storage)
    except Exception:  # an unreadable database: let the plugin's create_study report it
        return 0
    return next((s.n_trials for s in summaries if s.study_name == study_name), 0)


@dataclass
class OptunaSweeperConf(PluginOptunaSweeperConf):
    """hydra-optuna-sweeper's settings (sampler, n_trials, params, ...) with this project's defaults.

        python -m dpo_sweeps -m hydra/sweeper=optuna hydra.sweep.dir=multirun/study \\
            'loss.beta=tag(log, interval(0.02, 1.0))' 'train.batch_size=choice(16,32,64)'
    Keep hydra.sweep.dir stable (name it, or use a preset such as conf/sweep/optuna_dpo.yaml):
    the study lives there.
    """

    _target_: str = "hydra_plugins.dpo_sweeps_launchers.OptunaSweeper"
    # The summary.json metrics each trial returns, one per direction (INTERFACE.md names), e.g.
    # [eval/rewards/accuracies, perf/speed_per_memory] with direction [maximize, maximize].
    objectives: list[str] = field(default_factory=lambda: ["eval/rewards/accuracies"])
    # maximize or minimize, one per objective.
    direction: Any = field(default_factory=lambda: ["maximize"])
    # The study, in the sweep directory: the same command again continues it.
    storage: Any | None = "sqlite:///${hydra.sweep.dir}/optuna.db"
    study_name: str | None = "dpo_sweeps"
    # Trials running at once: a new one is asked for and launched as soon as any running trial ends.
    n_jobs: int = 1
    # Failed trials are told to the study as FAIL and the search goes on (1.0); 0.0 stops at the first.
    max_failure_rate: float = 1.0
    # Print the study's state and search space, and launch nothing.
    dry_run: bool = False
    # Stop hopeless trials early: none | median | successive_halving | hyperband (optuna.pruners). Every
    # evaluation (train.eval_every) reports the objective, which must be an eval/* metric; one objective only.
    pruner: str = "none"
    # The pruner's own arguments, e.g. {n_startup_trials: 2, n_warmup_steps: 0} for median.
    pruner_settings: Any = None
    # Trials to run first, each a mapping of parameter to value ({train.lr: 0.003, loss.beta: 0.1}),
    # e.g. known-good settings (Optuna's enqueue_trial); the sampler proposes the rest.
    enqueue_trials: Any = None
    # Trials whose estimated peak memory exceeds resources.device_memory_gib are not started (FAIL in the
    # study, summary status skipped, kind oom_predicted); false runs them anyway.
    skip_predicted_oom: bool = True


def register_optuna_config() -> None:
    """Make `hydra/sweeper=optuna` mean OptunaSweeperConf (replacing the plugin's entry of that name)."""
    ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="dpo_sweeps")
