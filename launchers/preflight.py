"""Check every point of a sweep before any job starts.

Each point is composed (`launchers.jobs.compose_job`), checked by `dpo_sweeps.config.validate.validate_config`
(cheap: no data or model is loaded) and by the launcher (`check_job`: what this launcher can place,
e.g. a 2-node job on the local launcher). A sweep with any invalid point is refused as a whole,
with every invalid point listed beside its overrides.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf

from dpo_sweeps.errors import RunFailure
from dpo_sweeps.rundir.outputs import write_summary
from launchers.jobs import JobCompositionError, PointLabels, SweepJob, compose_job

log = logging.getLogger("launchers")

# How many invalid points the refusal lists before it says "and N more".
MAX_LISTED = 50


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


def check_job(job: SweepJob, base_dir: Path,
              launcher_check: Callable[[SweepJob], str | None] | None) -> InvalidPoint | None:
    """The reason this composed job cannot run, or None."""
    try:
        # The training stack loads here, when a sweep is checked, not when Hydra imports the plugins.
        from dpo_sweeps.config.validate import validate_config

        validate_config(OmegaConf.create(job.task_config), base_dir)
    except RunFailure as exc:
        return InvalidPoint(job.num, job.overrides, exc.kind, str(exc), job)
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
) -> tuple[list[SweepJob], list[InvalidPoint]]:
    """Compose and check every point; returns the good jobs and the invalid points (numbered from first_num)."""
    base_dir = base_dir or Path.cwd()
    launcher_check = getattr(launcher, "check_job", None)
    jobs: list[SweepJob] = []
    invalid: list[InvalidPoint] = []
    for offset, overrides in enumerate(points):
        num = first_num + offset
        try:
            job = compose_job(hydra_context, master_config, overrides, num)
        except JobCompositionError as exc:
            invalid.append(InvalidPoint(num, list(overrides), "invalid_config", f"cannot compose this config: {exc}"))
            continue
        problem = check_job(job, base_dir, launcher_check)
        if problem is not None:
            invalid.append(problem)
        else:
            jobs.append(job)
    return jobs, invalid


@dataclass
class PredictedOOM:
    """A valid point that would not fit its device (dpo_sweeps/parallel/fit.py): not started, recorded as skipped."""

    job: SweepJob
    estimate_gib: float
    limit_gib: float
    message: str


def predicted_ooms(jobs: Sequence[SweepJob]) -> tuple[list[SweepJob], list[PredictedOOM]]:
    """Split jobs into those that fit (or have no limit to check) and those predicted out of memory."""
    from dpo_sweeps.parallel.fit import check_fit  # the training stack loads when a sweep is checked

    fit: list[SweepJob] = []
    unfit: list[PredictedOOM] = []
    for job in jobs:
        try:
            check = check_fit(OmegaConf.create(job.task_config), job.world_size)
        except (OSError, ValueError) as exc:  # e.g. a hub model not in the local cache: run it unchecked
            log.warning("#%d: no fit check (%s)", job.num, str(exc).splitlines()[0] if str(exc) else exc)
            check = None
        if check is None or check.fits:
            fit.append(job)
        else:
            unfit.append(PredictedOOM(job, check.estimate_gib, check.limit_gib, check.message()))
    return fit, unfit


def record_predicted_oom(point: PredictedOOM) -> None:
    """Its summary.json: status skipped, kind oom_predicted, with the estimate and the limit."""
    job = point.job
    job.run_dir.mkdir(parents=True, exist_ok=True)
    write_summary(job.run_dir, status="skipped", failure={"kind": "oom_predicted", "message": point.message},
                  overrides=list(job.overrides), config=job.task_config,
                  metrics={"perf/peak_memory_estimate_gib": point.estimate_gib,
                           "fit/device_memory_gib": point.limit_gib},
                  extra={"written_by": "sweeper: fit check", "wall_s": 0.0, "device_seconds": 0.0})


def refusal_message(invalid: Sequence[InvalidPoint], points: Sequence[Sequence[str]]) -> str:
    """The one screen that says which points are invalid and why; nothing was launched."""
    label = PointLabels(points)
    lines = [f"{len(invalid)} of {len(points)} points of this sweep are invalid; no job was started. Fix or leave out:"]
    for point in invalid[:MAX_LISTED]:
        lines.append(f"  #{point.num}  {label(point.overrides)}")
        lines.append(f"        {point.kind}: {point.message}")
    if len(invalid) > MAX_LISTED:
        lines.append(f"  ... and {len(invalid) - MAX_LISTED} more")
    if label.shared:
        lines.append(f"(every point also has: {label.shared_words})")
    return "\n".join(lines)
