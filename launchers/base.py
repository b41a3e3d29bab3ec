"""What the local and SLURM launchers share: per-job submission, the job side, and collecting results.

Both launchers submit one submitit job per run with `resources.nodes` x `resources.nproc_per_node`
tasks, one task per rank, taken from that run's own config (a sweep may vary them); a probe batch
(launchers.jobs.probe_batches) is one job whose tasks run its probes in turn. Every task
runs the Hydra job (hydra-submitit-launcher's design); tasks other than rank 0 write nothing into
the run directory (no `.hydra/`, no log file), and `dpo_sweeps.runtime.rank` lets only rank 0 write outputs.

When a job ends without rank 0 having written summary.json (a rank killed, a timeout, a
preemption, a node failure), the launcher writes a failed one, so every launched run has one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from dpo_sweeps.launchers.jobs import JobCompositionError, SweepJob, compose_job
from dpo_sweeps.launchers.placement import Placement
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

    # ------------------------------------------------------------------ the job side
    def __call__(  # type: ignore[override]
        self,
        runs: list[tuple[int, DictConfig]],
        singleton_state: dict[type, Singleton],
        placement: Placement | None = None,
    ) -> list[JobReturn]:
        """Runs in each task (rank) of the submitted job: its run, or a probe batch's runs in turn
        (`runs`: each one's job number and config, as the sweep composed it); one JobReturn per run
        it got to."""
        import submitit

        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        Singleton.set_state(singleton_state)
        setup_globals()
        env = submitit.JobEnvironment()
        if placement is not None:  # before anything touches CUDA (a batch's runs share their resources)
            placement.apply(env.local_rank, env.num_tasks // env.num_nodes,
                            bind_cores=runs[0][1].resources.bind_cores)
        if len(runs) == 1:
            return [self._run_job(runs[0][1], runs[0][0], env)]
        from dpo_sweeps.runtime.shared_ranks import all_completed, free_previous_run, sharing_ranks

        returns: list[JobReturn] = []
        with sharing_ranks():
            for num, config in runs:
                returns.append(self._run_job(config, num, env))
                # Every rank goes on only if every rank completed this run; else the launcher starts the rest anew.
                if not all_completed(returns[-1].status == JobStatus.COMPLETED):
                    break
                free_previous_run()
        return returns

    def _run_job(self, sweep_config: Any, job_num: int, env: Any) -> JobReturn:
        """One run of the job: the Hydra job, in its own run directory."""
        with read_write(sweep_config.hydra), open_dict(sweep_config.hydra.job) as job:
            job.id = env.job_id
            job.num = job_num
        if env.global_rank != 0:
            _quiet_hydra_outputs(sweep_config)
        return run_job(
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )

    def _submit_args(self, jobs: Sequence[SweepJob], placement: Placement | None = None) -> tuple:
        # Each job's config as the sweep composed it (launchers.jobs): the job need not compose it again.
        return ([(job.num, job.config) for job in jobs], Singleton.get_state(), placement)


def task_overrides(job: SweepJob) -> list[str]:
    overrides = OmegaConf.to_container(job.config.hydra.overrides.task, resolve=False)
    return list(overrides) if isinstance(overrides, list) else list(job.overrides)


def failed_return(overrides: list[str], error: BaseException, job: SweepJob | None = None) -> JobReturn:
    ret = JobReturn(overrides=list(overrides), status=JobStatus.FAILED, task_name="dpo_sweeps")
    ret.return_value = error
    if job is not None:
        ret.working_dir = str(job.run_dir)
    return ret


def _quiet_hydra_outputs(config: Any) -> None:
    """For ranks other than 0: no `.hydra/` copy and no log file in the run directory."""
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.output_subdir = None
        logging_cfg = config.hydra.job_logging
        handlers = logging_cfg.get("handlers") or {}
        to_files = [name for name, handler in handlers.items() if handler is not None and "filename" in handler]
        sections = [logging_cfg.get("root"), *((logging_cfg.get("loggers") or {}).values())]
        for section in sections:
            if section is not None and section.get("handlers"):
                section.handlers = [h for h in section.handlers if h not in to_files]
        for name in to_files:
            del handlers[name]
