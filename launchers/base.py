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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.launchers.jobs import JobCompositionError, SweepJob, compose_job
from dpo_sweeps.launchers.placement import Placement
from dpo_sweeps.launchers.slurm.forensics import STATE_KINDS, ended_in_srun_log, name_the_dead_rank, state_of
from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock
from dpo_sweeps.rundir.outputs import (
    FAILURE_FIELDS,
    SUMMARY,
    first_failure,
    read_summary,
    write_summary,
)
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

    # ------------------------------------------------------------------ collecting results
    def _collect_unit(self, jobs: Sequence[SweepJob], submitted: Any, started: float,
                      earlier_summaries: Sequence[int | None], timeout_min: float,
                      known_failure: dict | None = None) -> tuple[list[JobReturn], list[int]]:
        """The JobReturns of a job's runs, in order, as far as it got; and the positions of the runs it
        never started (a probe batch stops at a failed run: the launcher starts the rest anew)."""
        returns: list[JobReturn] | None = None
        error: BaseException | None = None
        try:
            if known_failure is None:  # a cancelled job has no result (submitit would wait for one)
                returns = list(submitted.task(0).result())
        except Exception as exc:  # submitit's UncompletedJobError / FailedJobError, or a lost job
            error = exc
        collected: list[JobReturn] = []
        for pos, (job, earlier) in enumerate(zip(jobs, earlier_summaries)):
            ret = returns[pos] if returns is not None and pos < len(returns) else None
            if ret is None and returns is not None:  # the job ended after an earlier run failed
                return collected, list(range(pos, len(jobs)))
            fresh = summary_stamp(job.run_dir) != earlier
            collected.append(self._collect(job, submitted, started, earlier, timeout_min, known_failure, ret, error))
            if ret is None and not fresh:  # the job died in this run (or just before it)
                return collected, list(range(pos + 1, len(jobs)))
        return collected, []

    def _collect(self, job: SweepJob, submitted: Any, started: float, earlier_summary: int | None,
                 timeout_min: float, known_failure: dict | None, ret: JobReturn | None,
                 error: BaseException | None) -> JobReturn:
        """Rank 0's JobReturn of one run (`ret`: None when the job died); when rank 0 wrote no
        summary.json for this attempt, write a failed one (`known_failure`: what the launcher itself
        found, e.g. every rank stopped)."""
        summary = read_summary(job.run_dir)
        fresh = summary is not None and summary_stamp(job.run_dir) != earlier_summary
        if fresh and summary.get("status") == "failed":
            name_the_dead_rank(job.run_dir, summary, submitted)
        if fresh and ret is not None:
            return ret
        if fresh and summary.get("status") == "completed":
            done = JobReturn(overrides=list(job.overrides), status=JobStatus.COMPLETED, task_name="dpo_sweeps",
                             working_dir=str(job.run_dir))
            done.return_value = summary.get("metrics") or {}
            return done
        if fresh:
            failure = summary.get("failure") or Failure(FailureKind.CRASH, "job ended abnormally").brief()
            return failed_return(job.overrides, JobNotRun(f"{failure['kind']}: {failure['message']}"), job)
        state = state_of(submitted)
        elapsed = time.monotonic() - started
        kind = STATE_KINDS.get(state.split()[0] if state else "", "crash")
        if kind == "crash" and timeout_min and elapsed >= 60 * timeout_min - 5:
            kind = "timeout"
        found = first_failure(job.run_dir, ended_in_srun_log(submitted)) or {}
        message = _failure_message(found, state, error, submitted)
        if kind == "crash" and found.get("reported_by") is not None:  # what a rank recorded beats "the job ended"
            kind = found["kind"]
        failure = Failure(FailureKind(kind), message, found.get("rank"), found.get("step"), found.get("cause") or message).record()
        if known_failure is not None:
            failure = {k: known_failure.get(k) for k in FAILURE_FIELDS}
            kind, message = failure["kind"], failure["message"]
        try:
            lock = RunDirLock(job.run_dir).acquire()
        except RunDirInUse as exc:  # another live job owns the directory (the run refused to start): leave it be
            return failed_return(job.overrides, JobNotRun(str(exc)), job)
        try:
            write_summary(job.run_dir, status="failed", failure=failure,
                          overrides=task_overrides(job), config=job.task_config, metrics={},
                          extra={"attempt": f"launcher-{job.num}-{int(time.time())}", "written_by": "launcher"})
        finally:
            lock.release()
        return failed_return(job.overrides, JobNotRun(f"{kind}: {message}"), job)


def _failure_message(found: dict, state: str, error: BaseException | None, submitted: Any) -> str:
    """The failure message of a job that ended without rank 0's summary.json (`found`: first_failure's)."""
    if found.get("reported_by") is not None:  # a rank recorded why
        return found["message"]
    detail = ""
    if error is not None:
        lines = [ln.strip() for ln in str(error).splitlines() if ln.strip() and not set(ln.strip()) <= {"-"}]
        # submitit's message opens with "Job X (task: 0) with path ..."; the cause is further down.
        causes = [ln for ln in lines if "Error" in ln or "error" in ln or "Killed" in ln]
        detail = (causes[-1] if causes else lines[0] if lines else type(error).__name__)[:300]
    logs = ""
    try:
        logs = f"; logs: {submitted.paths.folder}"
    except Exception:
        pass
    what = f"job ended without rank 0 writing summary.json (state {state or 'UNKNOWN'})"
    if found:  # rank 0 was killed with the step: srun's log still says which tasks ended first
        what = f"{found['message']}; {what}"
    return what + (f": {detail}" if detail else "") + logs


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


def runs_written(jobs: Sequence[SweepJob], earlier: Sequence[int | None]) -> int:
    """How many of a started job's runs (one, or a probe batch's in turn) have written a new summary.json
    (`earlier`: each one's summary_stamp before the start): the job is on the next one."""
    return next((p for p, (job, stamp) in enumerate(zip(jobs, earlier)) if summary_stamp(job.run_dir) == stamp),
                len(jobs))


def summary_stamp(run_dir: Path) -> int | None:
    """When run_dir's summary.json was last written (None: there is none), to tell a new one from an old."""
    try:
        return (Path(run_dir) / SUMMARY).stat().st_mtime_ns
    except OSError:
        return None
