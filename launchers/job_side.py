"""The job side: what runs in each task (rank) of a job the local or SLURM launcher submitted.

submitit unpickles the launcher in every task and calls it (SweepLauncher.__call__), which runs the
job's Hydra job here: its run, or a probe batch's runs in turn in the same rank processes
(dpo_sweeps/runtime/shared_ranks.py). Every task runs the Hydra job (hydra-submitit-launcher's design);
tasks other than rank 0 write nothing into the run directory (no `.hydra/`, no log file).
"""

from __future__ import annotations

import os
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict, read_write

from dpo_sweeps.launchers.placement import Placement
from dpo_sweeps.redaction import redact_output
from dpo_sweeps.runtime.context import ATTEMPT_ENV


def run_in_task(hydra_context: HydraContext, task_function: TaskFunction, runs: list[tuple[int, DictConfig, str]],
                singleton_state: dict[type, Singleton], placement: Placement | None = None) -> list[JobReturn]:
    """This task's runs, in turn (`runs`: each one's job number, config and the attempt id the launcher
    gave it); one JobReturn per run it got to."""
    import submitit

    redact_output()  # the task's output is submitit's log file in the sweep directory
    Singleton.set_state(singleton_state)
    setup_globals()
    env = submitit.JobEnvironment()
    if placement is not None:  # before anything touches CUDA (a batch's runs share their resources)
        placement.apply(env.local_rank, env.num_tasks // env.num_nodes,
                        bind_cores=runs[0][1].resources.bind_cores)
    if len(runs) == 1:
        return [_run_job(hydra_context, task_function, *runs[0], env)]
    from dpo_sweeps.runtime.shared_ranks import all_completed, free_previous_run, sharing_ranks

    returns: list[JobReturn] = []
    with sharing_ranks():
        for run in runs:
            returns.append(_run_job(hydra_context, task_function, *run, env))
            # Every rank goes on only if every rank completed this run; else the launcher starts the rest anew.
            if not all_completed(returns[-1].status == JobStatus.COMPLETED):
                break
            free_previous_run()
    return returns


def _run_job(hydra_context: HydraContext, task_function: TaskFunction, job_num: int, sweep_config: Any,
             attempt: str, env: Any) -> JobReturn:
    """One run of the job: the Hydra job, in its own run directory, as the attempt the launcher named."""
    with read_write(sweep_config.hydra), open_dict(sweep_config.hydra.job) as job:
        job.id = env.job_id
        job.num = job_num
    if env.global_rank != 0:
        _quiet_hydra_outputs(sweep_config)
    os.environ[ATTEMPT_ENV] = attempt  # the run's summary.json carries it (dpo_sweeps/app.py)
    try:
        return run_job(
            hydra_context=hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
    finally:
        os.environ.pop(ATTEMPT_ENV, None)


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
