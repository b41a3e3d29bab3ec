"""Check every point of a sweep before any job starts.

Each point is composed (`launchers.jobs.compose_job`), read as its typed Config and checked by
`dpo_sweeps.checks.validate.validate_config` (cheap: no data or model is loaded) and by the launcher
(`check_job`: what this launcher can place, e.g. a 2-node job on the local launcher). A sweep with any
invalid point is refused as a whole, with the first invalid points listed beside their overrides and
the count of the rest.

A sweep may have thousands of points: the checks read each point's typed config from one
`CheckedConfig`, whose sections are typed again only where a point differs from the one before;
validation runs once per distinct `validation_key`, the fit check once per distinct estimate
(dpo_sweeps/parallel/fit.py `fit_key`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from hydra.types import HydraContext
from omegaconf import DictConfig

from dpo_sweeps.checks.unused import Launch, SettingsRead
from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import Failure, FailureKind, InvalidConfig, RunFailure
from dpo_sweeps.launchers.jobs import JobCompositionError, PointLabels, SweepJob, compose_job
from dpo_sweeps.rundir.summary import Status, Summary, write_summary

log = logging.getLogger("launchers")

# How many invalid points the refusal lists before it says "and N more".
MAX_LISTED = 20


@dataclass
class InvalidPoint:
    num: int
    overrides: list[str]
    # The failure.kind a run would end with: invalid_config or data_error.
    kind: str
    message: str
    # The composed job, when composition itself worked.
    job: SweepJob | None = None


class InvalidSweep(CompactHydraException):
    """Raised before launch when points of a sweep cannot run; the message lists them all."""


class CheckedConfig:
    """The typed config the checks read (Config.of of a point's task config) for a sweep's points in turn:
    a section is typed again only where a point's differs from the previous point's, and `validate` gives
    validate_config's verdict once per distinct `validation_key`."""

    def __init__(self) -> None:
        self.config: Config | None = None  # the previous point's
        self.sections: dict[str, Any] = {}  # the previous point's plain sections
        self.verdicts: dict[str, RunFailure | None] = {}

    def of(self, task_config: dict[str, Any]) -> Config:
        changed = {key for key, value in task_config.items()
                   if key not in self.sections or (self.sections[key] is not value and self.sections[key] != value)}
        if self.config is None or changed or len(self.sections) != len(task_config):
            typed = {key: Config.section(key, task_config[key]) if key in changed else getattr(self.config, key)
                     for key in SECTIONS if key in task_config}
            self.config, self.sections = Config(**typed), dict(task_config)
        return self.config

    def validate(self, task_config: dict[str, Any], base_dir: Path) -> RunFailure | None:
        # The training stack loads here, when a sweep is checked, not when Hydra imports the plugins.
        from dpo_sweeps.checks.validate import validate_config, validation_key

        key = validation_key(task_config)
        if key not in self.verdicts:
            try:
                validate_config(self.of(task_config), base_dir)
                self.verdicts[key] = None
            except RunFailure as exc:
                self.verdicts[key] = exc
        return self.verdicts[key]


# The sections of a task config that are Config's (a top-level key added with `+` is none).
SECTIONS = tuple(f.name for f in fields(Config))


def check_job(job: SweepJob, base_dir: Path,
              launcher_check: Callable[[SweepJob], str | None] | None,
              checked: CheckedConfig | None = None) -> InvalidPoint | None:
    """The reason this composed job cannot run, or None."""
    checked = checked or CheckedConfig()
    failure = checked.validate(job.task_config, base_dir)
    if failure is not None:
        return InvalidPoint(job.num, job.overrides, failure.kind, str(failure), job)
    if launcher_check is not None:
        problem = launcher_check(job)
        if problem:
            return InvalidPoint(job.num, job.overrides, "invalid_config", problem, job)
    return None


def compose_and_check(
    hydra_context: HydraContext,
    master_config: DictConfig,
    points: Sequence[Sequence[str]],
    first_num: int,
    launcher: Any,
    base_dir: Path | None = None,
    whole_sweep: bool = False,
) -> tuple[list[SweepJob], list[InvalidPoint]]:
    """Compose and check every point; returns the good jobs and the invalid points (numbered from first_num).

    `whole_sweep`: `points` are all the sweep will run (a grid, not one Optuna trial), so a setting they
    give that none of them reads is refused (dpo_sweeps/checks/unused.py)."""
    base_dir = base_dir or Path.cwd()
    launcher_check = getattr(launcher, "check_job", None)
    jobs: list[SweepJob] = []
    invalid: list[InvalidPoint] = []
    checked = CheckedConfig()
    settings = SettingsRead(_launch_of(launcher))
    for offset, overrides in enumerate(points):
        num = first_num + offset
        try:
            job = compose_job(hydra_context, master_config, overrides, num)
        except JobCompositionError as exc:
            invalid.append(InvalidPoint(num, list(overrides), "invalid_config", f"cannot compose this config: {exc}"))
            continue
        if not jobs and not invalid:
            _start_fit_measurements(job)
        problem = check_job(job, base_dir, launcher_check, checked)
        if problem is not None:
            invalid.append(problem)
        else:
            jobs.append(job)
            if whole_sweep:
                settings.add(job.overrides, lambda job=job: checked.of(job.task_config))
    try:
        if not invalid:  # invalid points are refused first (a setting may be read at those only)
            settings.check()
    except InvalidConfig as exc:
        raise InvalidSweep(f"{exc}; no job was started") from None
    return jobs, invalid


def refuse_unread_settings(hydra_context: HydraContext, master_config: DictConfig, points: Sequence[Sequence[str]],
                           launcher: Any, only_point: str, sample: bool = False) -> None:
    """Raise InvalidSweep for a setting `points` give that none of them reads (dpo_sweeps/checks/unused.py).
    For points drawn from a search space (an Optuna study's): each is composed and typed, nothing more, and
    only while a setting it gives is still unread; one that cannot be composed or typed is left out (its
    trial is refused when drawn). `sample`: the points are a sample of those the sweep can run, where an
    unread setting may still be read at a point not drawn: it is a warning, not a refusal."""
    checked = CheckedConfig()
    settings = SettingsRead(_launch_of(launcher))
    for num, overrides in enumerate(points):
        try:
            settings.add(list(overrides),
                         lambda o=overrides, n=num: checked.of(compose_job(hydra_context, master_config, o, n).task_config))
        except (JobCompositionError, RunFailure):
            continue
    try:
        settings.check(only_point)
    except InvalidConfig as exc:
        if sample:
            log.warning("%s (checked on %d points drawn from the search space, which may not hold the one that "
                        "reads it; the study starts)", exc, len(points))
            return
        raise InvalidSweep(f"{exc}; no job was started") from None


def _launch_of(launcher: Any) -> Launch:
    """Who starts the jobs' ranks, by the launcher."""
    return Launch(getattr(launcher, "_EXECUTOR", Launch.LOCAL))


def _start_fit_measurements(job: SweepJob) -> None:
    """What the fit check measures once (a fresh rank process's memory) starts while the points compose."""
    from dpo_sweeps.parallel.fit import may_have_limit, measure_in_background

    config = Config.of(job.task_config)
    if may_have_limit(config.resources, config.cluster):
        measure_in_background(config.model)


@dataclass
class PredictedOOM:
    """A valid point that would not fit its device (dpo_sweeps/parallel/fit.py): not started, recorded as skipped."""

    job: SweepJob
    estimate_gib: float
    limit_gib: float
    message: str


def fit_checks(jobs: Sequence[SweepJob]) -> list[tuple[SweepJob, Any]]:
    """Each job with its FitCheck (dpo_sweeps/parallel/fit.py), one check per distinct `fit_key`; None where
    there is no limit to check against, or no estimate (the job then runs unchecked)."""
    from dpo_sweeps.parallel.fit import check_fit, fit_key  # the training stack loads when a sweep is checked

    checked = CheckedConfig()
    checks: dict[str, Any] = {}  # fit_key -> its FitCheck or None
    out = []
    for job in jobs:
        key = fit_key(job.task_config, job.world_size)
        if key not in checks:
            try:
                checks[key] = check_fit(checked.of(job.task_config), job.world_size)
            except (OSError, ValueError) as exc:  # e.g. a hub model not in the local cache: run it unchecked
                log.warning("#%d (and the points of the same estimate): no fit check (%s)", job.num,
                            str(exc).splitlines()[0] if str(exc) else exc)
                checks[key] = None
        out.append((job, checks[key]))
    return out


def predicted_oom(job: SweepJob, check: Any) -> PredictedOOM | None:
    """The job as a point predicted out of memory, or None when it fits (or was not checked)."""
    if check is None or check.fits:
        return None
    return PredictedOOM(job, check.estimate_gib, check.limit_gib, check.message())


def predicted_ooms(jobs: Sequence[SweepJob]) -> tuple[list[SweepJob], list[PredictedOOM], dict[int, Any]]:
    """Split jobs into those that fit (or have no limit to check) and those predicted out of memory; and
    every job's FitCheck (or None) by number."""
    fit: list[SweepJob] = []
    unfit: list[PredictedOOM] = []
    checks: dict[int, Any] = {}
    for job, check in fit_checks(jobs):
        checks[job.num] = check
        point = predicted_oom(job, check)
        if point is None:
            fit.append(job)
        else:
            unfit.append(point)
    return fit, unfit, checks


def record_predicted_oom(point: PredictedOOM) -> None:
    """Its summary.json: status skipped, kind oom_predicted, with the estimate and the limit."""
    job = point.job
    job.run_dir.mkdir(parents=True, exist_ok=True)
    write_summary(job.run_dir, Summary(
        Status.SKIPPED, Failure(FailureKind.OOM_PREDICTED, point.message, started=False), list(job.overrides),
        job.task_config, {"perf/peak_memory_estimate_gib": point.estimate_gib, "fit/device_memory_gib": point.limit_gib},
        written_by="sweeper: fit check", wall_s=0.0, device_seconds=0.0))


def refusal_message(invalid: Sequence[InvalidPoint], points: Sequence[Sequence[str]]) -> str:
    """The one screen that says which points are invalid and why; nothing was launched."""
    label = PointLabels(points)
    lines = [f"{len(invalid)} of {len(points)} points of this sweep are invalid; no job was started. Fix or leave out"
             + (f" (the first {MAX_LISTED}):" if len(invalid) > MAX_LISTED else ":")]
    for point in invalid[:MAX_LISTED]:
        lines.append(f"  #{point.num}  {label(point.overrides)}")
        lines.append(f"        {point.kind}: {point.message}")
    if len(invalid) > MAX_LISTED:
        lines.append(f"  ... and {len(invalid) - MAX_LISTED} more")
    if label.shared:
        lines.append(f"(every point also has: {label.shared_words})")
    return "\n".join(lines)
