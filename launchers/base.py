"""What the local and SLURM launchers share: the Hydra launcher they both are (SweepLauncher), per-job
submission, and the JobReturn of a job that did not run.

Both launchers submit one submitit job per run with `resources.nodes` x `resources.nproc_per_node`
tasks, one task per rank, taken from that run's own config (a sweep may vary them); a probe batch
(launchers.jobs.probe_batches) is one job whose tasks run its probes in turn. Every task
runs the Hydra job (hydra-submitit-launcher's design); tasks other than rank 0 write nothing into
the run directory (no `.hydra/`, no log file), and `dpo_sweeps.train.lifecycle` lets only rank 0 write outputs.

What runs in each task is launchers/job_side.py; collecting a job's results (and the failed
summary.json of a job that ended without rank 0's) is launchers/collect.py; the progress line
launchers/progress.py; what SLURM says of a job that died launchers/forensics.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from dpo_sweeps.launchers.job_side import run_in_task
from dpo_sweeps.launchers.jobs import JobCompositionError, SweepJob, compose_job
from dpo_sweeps.launchers.placement import Placement
from dpo_sweeps.redaction import scrub_secrets
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

log = logging.getLogger("launchers")


def probes_per_job_of(value: Any) -> int | None:
    """hydra.launcher.probes_per_job, checked: how many probes one set of rank processes runs in turn."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"hydra.launcher.probes_per_job: got {value!r} (accepted: null to spread a sweep's "
                         "probes over the jobs that run at once, or an integer >= 1; 1: every probe alone)")
    return value


class JobNotRun(Exception):
    """Why a job was not started (its config could not be composed, or it cannot be placed)."""


class SweepLauncher(BaseSubmititLauncher):
    """Base of the dpo-sweeps launchers: `launch_jobs` places already-composed jobs."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Hydra's Launcher API: compose each job, then `launch_jobs`."""
        assert self.config is not None and self.hydra_context is not None
        jobs: list[SweepJob | JobReturn] = []
        for i, overrides in enumerate(job_overrides):
            try:
                jobs.append(compose_job(self.hydra_context, self.config, overrides, initial_job_idx + i))
            except JobCompositionError as exc:
                jobs.append(failed_return(list(overrides), JobNotRun(f"cannot compose this config: {exc}")))
        composed = [j for j in jobs if isinstance(j, SweepJob)]
        returns = iter(self.launch_jobs(composed) if composed else [])
        return [next(returns) if isinstance(j, SweepJob) else j for j in jobs]

    def launch_jobs(self, jobs: Sequence[SweepJob]) -> list[JobReturn]:
        """Run the jobs (each under its own number and run directory); one JobReturn per job, in order."""
        raise NotImplementedError

    def check_job(self, job: SweepJob) -> str | None:
        """Why this launcher cannot run the job (checked before a sweep launches anything), or None."""
        return None

    def describe(self) -> str:
        """Where jobs go, in one line (for dry runs)."""
        return f"{self._EXECUTOR} launcher"

    def describe_job(self, job: SweepJob) -> str:
        """What one job asks for, in a few words (for dry runs)."""
        return f"{job.world_size} rank{'s' if job.world_size > 1 else ''}"

    def __getstate__(self) -> dict[str, Any]:
        """What submitit pickles into the sweep directory for every job: this launcher, less the secrets of
        its settings (a setup line's password): the job side runs the Hydra job, not the batch script."""
        state = dict(self.__dict__)
        for name in ("params", "sbatch_params"):
            if name in state:
                state[name] = {k: scrub_secrets(OmegaConf.to_container(v) if OmegaConf.is_config(v) else v)
                               for k, v in state[name].items()}
        return state

    # ------------------------------------------------------------------ the job side
    def __call__(  # type: ignore[override]
        self,
        runs: list[tuple[int, DictConfig, str]],
        singleton_state: dict[type, Singleton],
        placement: Placement | None = None,
    ) -> list[JobReturn]:
        """Runs in each task (rank) of the submitted job: its run, or a probe batch's runs in turn
        (`runs`: each one's job number, config as the sweep composed it, and attempt id); one JobReturn per run
        it got to (launchers/job_side.py)."""
        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        return run_in_task(self.hydra_context, self.task_function, runs, singleton_state, placement)

    def _submit_args(self, jobs: Sequence[SweepJob], attempts: Sequence[str], placement: Placement | None = None) -> tuple:
        # Each job's config as the sweep composed it (launchers.jobs): the job need not compose it again;
        # and the id of the attempt this launch starts, which its summary.json will carry (collect.py).
        return ([(job.num, job.config, attempt) for job, attempt in zip(jobs, attempts)], Singleton.get_state(),
                placement)


def task_overrides(job: SweepJob) -> list[str]:
    overrides = OmegaConf.to_container(job.config.hydra.overrides.task, resolve=False)
    return list(overrides) if isinstance(overrides, list) else list(job.overrides)


def failed_return(overrides: list[str], error: BaseException, job: SweepJob | None = None) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED, task_name="dpo_sweeps")
    ret.return_value = error
    if job is not None:
        ret.working_dir = str(job.run_dir)
    return ret
