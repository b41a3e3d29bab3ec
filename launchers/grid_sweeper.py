"""`hydra/sweeper=grid` (the default): Hydra's grid, checked whole, resumable, summed up at the end.

The grid is Hydra's basic sweep (every combination of the comma-separated values and of
`hydra.sweeper.params`). Before any job starts:
1. every point is composed and validated; if any is invalid, the sweep is refused with all
   invalid points listed beside their overrides (`launchers.preflight`);
2. points whose run already completed in this sweep directory (same `config_hash`) are skipped
   (`launchers.resume`; `hydra.sweeper.resume=false` runs them again);
3. points whose estimated peak memory exceeds `resources.device_memory_gib` are not started and
   are recorded as skipped, kind `oom_predicted` (`dpo_sweeps.parallel.fit`; `hydra.sweeper.skip_predicted_oom=false`
   runs them anyway);
4. with `hydra.sweeper.dry_run=true`, the jobs that would run are listed and nothing starts.
With `hydra.sweeper.stages` (conf/sweep/find_best.yaml) the sweep is a staged search instead:
probes of the parallel plans, then full training of the algorithm settings on the best of them,
ending in a recommended command (`launchers.find_best`).
Then the launcher runs the rest. A failed run never stops the others; at the end one screen
gives the counts, where the results are and which runs failed and why, and the command exits
nonzero if any failed (`launchers.outcome`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from dpo_sweeps.launchers.cost_screen import measured_beside, predict_jobs, total_line
from dpo_sweeps.launchers.hydra_private import BasicSweeper
from dpo_sweeps.launchers.jobs import (
    PointLabels,
    SweepJob,
    launch_numbered,
    redact_sweep_config,
    write_multirun_yaml,
    writes_in_sweep_dir,
)
from dpo_sweeps.launchers.outcome import Outcome, outcome_of, raise_if_failed, sweep_screen
from dpo_sweeps.launchers.preflight import (
    InvalidSweep,
    PredictedOOM,
    compose_and_check,
    predicted_ooms,
    record_predicted_oom,
    refusal_message,
)
from dpo_sweeps.launchers.resume import PendingJobs, pending_jobs, wait_for_earlier_runs

log = logging.getLogger("launchers")


class GridSweeper(BasicSweeper):
    def __init__(
        self,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        dry_run: bool = False,
        resume: bool = True,
        skip_predicted_oom: bool = True,
        stages: Any = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise ValueError(
                f"hydra.sweeper.{', hydra.sweeper.'.join(sorted(unknown))}: not settings of the grid sweeper "
                "(accepted: params, dry_run, resume, skip_predicted_oom, stages, max_batch_size). A preset for another sweeper needs it "
                "on the command line, e.g. hydra/sweeper=optuna +sweep=optuna_dpo")
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.dry_run = dry_run
        self.resume = resume
        self.skip_predicted_oom = skip_predicted_oom
        self.stages = stages
        self.fit_checks: dict[int, Any] = {}  # the last launch's fit checks by job number (the cost screen's memory)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        redact_sweep_config(config)  # the launcher has its settings: the jobs' files get no secret

    def grid(self, arguments: list[str]) -> list[list[str]]:
        """Every point of the sweep, in Hydra's order: one override list per job."""
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides(self._parse_config() + list(arguments))
        return [point for batch in self.split_arguments(overrides, None) for point in batch]

    @writes_in_sweep_dir
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        if self.stages:  # the staged search of +sweep=find_best
            from dpo_sweeps.launchers.find_best import FindBest, Stages

            try:
                outcomes = FindBest(self, Stages.of(self.stages)).run(arguments)
            except KeyboardInterrupt:
                raise SystemExit(interrupted_message(Path(str(self.config.hydra.sweep.dir)))) from None
            raise_if_failed(outcomes)
            return []
        points = self.grid(arguments)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        jobs, invalid = compose_and_check(self.hydra_context, self.config, points, 0, self.launcher,
                                           whole_sweep=True)
        if invalid:
            raise InvalidSweep(refusal_message(invalid, points))
        pending, unfit = self.to_launch(jobs, sweep_dir)
        predictions = predict_jobs(pending.to_run, self.fit_checks)
        if self.dry_run:  # the points that have run are priced too (what they would cost again)
            done = predict_jobs([job for job, _ in pending.skipped])
            print(dry_run_listing(sweep_dir, pending, len(points), self.launcher, unfit, predictions, self.fit_checks,
                                  done))
            return []
        if total_line(predictions):
            print(total_line(predictions), flush=True)

        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_multirun_yaml(sweep_dir, self.config)
        if pending.skipped:
            log.info("%d of %d runs already completed in %s: skipped", len(pending.skipped), len(points), sweep_dir)
        try:
            outcomes, returns = self.launch_pending(pending, unfit)
        except KeyboardInterrupt:
            raise SystemExit(interrupted_message(sweep_dir)) from None
        print(sweep_screen(sweep_dir, outcomes), flush=True)
        raise_if_failed(outcomes)
        return [returns]

    def to_launch(self, jobs: list[SweepJob], sweep_dir: Path) -> tuple[PendingJobs, list[PredictedOOM]]:
        """Which checked jobs run: completed ones are reused (resume), unfit ones skipped (fit check)."""
        pending = pending_jobs(jobs, sweep_dir, skip_completed=self.resume)
        unfit: list[PredictedOOM] = []
        self.fit_checks = {}
        if self.skip_predicted_oom:
            pending.to_run, unfit, self.fit_checks = predicted_ooms(pending.to_run)
        return pending, unfit

    def launch_pending(self, pending: PendingJobs, unfit: list[PredictedOOM],
                       stage: str = "") -> tuple[list[Outcome], list[JobReturn]]:
        """Record the skipped points, launch the rest; every point's outcome, by number, and the returns.
        `stage`: the find_best stage they are, which the forecast line names."""
        for point in unfit:
            record_predicted_oom(point)
            log.warning("#%d not started: %s", point.job.num, point.message)
        wait_for_earlier_runs(pending)
        if hasattr(self.launcher, "forecasts_next_launch"):  # the local launcher: how long the sweep takes here
            self.launcher.forecasts_next_launch = stage or True
        returns = self._launch(pending.to_run)
        outcomes = [Outcome(job, "reused", where) for job, where in pending.skipped]
        outcomes += [Outcome(p.job, "skipped", p.job.run_dir, "oom_predicted", p.message) for p in unfit]
        outcomes += [outcome_of(job, ret) for job, ret in zip(pending.to_run, returns)]
        outcomes.sort(key=lambda o: o.job.num)
        return outcomes, returns

    def _launch(self, jobs: Sequence[SweepJob]) -> list[JobReturn]:
        """Hand the jobs to the launcher, `max_batch_size` at a time (default: all at once)."""
        returns: list[JobReturn] = []
        size = self.max_batch_size or len(jobs) or 1
        for start in range(0, len(jobs), size):
            returns += launch_numbered(self.launcher, list(jobs[start:start + size]))
        return returns


def interrupted_message(sweep_dir: Path) -> str:
    return (f"\nInterrupted: the sweep's running jobs were stopped. Run the same command again to go on "
            f"(completed runs in {sweep_dir} are skipped; stopped runs resume from their last checkpoint).")


def dry_run_listing(sweep_dir: Path, pending: PendingJobs, total: int, launcher: Any = None,
                    unfit: Sequence[PredictedOOM] = (), predictions: dict[int, Any] | None = None,
                    checks: dict[int, Any] | None = None, completed: dict[int, Any] | None = None) -> str:
    describe_job = getattr(launcher, "describe_job", None) or (lambda job: f"{job.world_size} ranks")
    label = PointLabels([j.overrides for j in pending.to_run] + [j.overrides for j, _ in pending.skipped]
                        + [p.job.overrides for p in unfit])
    lines = [f"dry run: {len(pending.to_run)} of {total} jobs would be launched into {sweep_dir} (none was started)"]
    if hasattr(launcher, "describe"):
        lines.append(f"launcher: {launcher.describe()}")
    if label.shared:
        lines.append(f"every job: {label.shared_words}")
    predictions = predictions or {}
    for job in pending.to_run:
        lines.append(f"  #{job.num}  {label(job.overrides)}   [{describe_job(job)} -> {job.run_dir}]")
        if job.num in predictions:
            check = (checks or {}).get(job.num)
            verdict = (f"fits {check.limit_gib:.0f} GiB" if check is not None else "no fit check")
            lines.append(f"        predicted: {predictions[job.num].text()}; {verdict}")
    if total_line(predictions):
        lines.append(total_line(predictions))
    if pending.skipped:
        lines.append(f"{len(pending.skipped)} already completed (skipped):")
        for job, where in pending.skipped:
            lines.append(f"  #{job.num}  {label(job.overrides)}   [completed in {where}]")
            if job.num in (completed or {}):
                lines.append(f"        predicted: {completed[job.num].text()}; "
                             f"{measured_beside(job, where, completed[job.num])}")
        if total_line(completed or {}):
            lines.append(f"completed points, priced again: {total_line(completed)}")
    if unfit:
        lines.append(f"{len(unfit)} predicted not to fit their device (would be skipped, kind oom_predicted):")
        for p in unfit:
            lines.append(f"  #{p.job.num}  {label(p.job.overrides)}   [estimate {p.estimate_gib:.2f} GiB > "
                         f"limit {p.limit_gib:.2f} GiB]")
    hashes: dict[str, list[int]] = {}
    for job in pending.to_run:
        hashes.setdefault(job.config_hash, []).append(job.num)
    for nums in hashes.values():
        if len(nums) > 1:
            lines.append(f"note: points {', '.join(f'#{n}' for n in nums)} define the same run (same config_hash)")
    return "\n".join(lines)
