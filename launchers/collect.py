"""Collecting a launched job's results: each run's JobReturn, and a failed summary.json for a run whose
rank 0 wrote none for this attempt (a rank killed, a timeout, a preemption, a node failure), so that
every launched run has one. The local and SLURM launchers call `collect_unit` for each job that ended.

A run's summary.json is this attempt's when it carries the attempt id the launcher gave the job
(rundir/summary.py read_summary): the same rule the local rank supervisor applies to its ranks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.launchers.base import JobNotRun, failed_return, task_overrides
from dpo_sweeps.launchers.forensics import (
    STATE_KINDS,
    ended_in_srun_log,
    lost_node_report,
    name_the_dead_rank,
    state_of,
)
from dpo_sweeps.launchers.jobs import SweepJob
from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock
from dpo_sweeps.rundir.rank_failures import RankReport, first_failure
from dpo_sweeps.rundir.summary import Status, Summary, read_summary, write_summary


def collect_unit(jobs: Sequence[SweepJob], submitted: Any, started: float, attempts: Sequence[str],
                 timeout_min: float, known_failure: Failure | None = None) -> tuple[list[JobReturn], list[int]]:
    """The JobReturns of a job's runs, in order, as far as it got; and the positions of the runs it
    never started (a probe batch stops at a failed run: the launcher starts the rest anew). `attempts`:
    the attempt id this launch gave each run (launchers/base.py _submit_args)."""
    returns: list[JobReturn] | None = None
    error: BaseException | None = None
    try:
        if known_failure is None:  # a cancelled job has no result (submitit would wait for one)
            returns = list(submitted.task(0).result())
    except Exception as exc:  # submitit's UncompletedJobError / FailedJobError, or a lost job
        error = exc
    collected: list[JobReturn] = []
    for pos, (job, attempt) in enumerate(zip(jobs, attempts)):
        ret = returns[pos] if returns is not None and pos < len(returns) else None
        if ret is None and returns is not None:  # the job ended after an earlier run failed
            return collected, list(range(pos, len(jobs)))
        written = read_summary(job.run_dir, attempt) is not None
        collected.append(collect(job, submitted, started, attempt, timeout_min, known_failure, ret, error))
        if ret is None and not written:  # the job died in this run (or just before it)
            return collected, list(range(pos + 1, len(jobs)))
    return collected, []


def collect(job: SweepJob, submitted: Any, started: float, attempt: str, timeout_min: float,
            known_failure: Failure | None, ret: JobReturn | None, error: BaseException | None) -> JobReturn:
    """Rank 0's JobReturn of one run (`ret`: None when the job died); when rank 0 wrote no
    summary.json for this attempt, write a failed one (`known_failure`: what the launcher itself
    found, e.g. every rank stopped)."""
    summary = read_summary(job.run_dir, attempt)
    if summary is not None and summary.status == Status.FAILED:
        name_the_dead_rank(job.run_dir, summary, submitted)
    if summary is not None and ret is not None:
        return ret
    if summary is not None and summary.status == Status.COMPLETED:
        done = JobReturn(overrides=list(job.overrides), status=JobStatus.COMPLETED, task_name="dpo_sweeps",
                         working_dir=str(job.run_dir))
        done.return_value = summary.metrics
        return done
    if summary is not None:
        failure = summary.failure or Failure(FailureKind.CRASH, "job ended abnormally")
        return failed_return(job.overrides, JobNotRun(f"{failure.kind}: {failure.message}"), job)
    state = state_of(submitted)
    elapsed = time.monotonic() - started
    kind = STATE_KINDS.get(state.split()[0] if state else "", "crash")
    if kind == "crash" and timeout_min and elapsed >= 60 * timeout_min - 5:
        kind = "timeout"
    found = first_failure(job.run_dir, ended_in_srun_log(submitted))
    if found is None and kind == "node_failure":  # the lost node's srun log went with it: its heartbeats tell
        found = lost_node_report(job.run_dir)
    message = _failure_message(found, state, error, submitted)
    if kind == "crash" and found is not None and found.reported_by is not None:  # what a rank recorded beats "the job ended"
        kind = found.failure.kind
    seen = found.failure if found is not None else Failure(FailureKind.CRASH, message)
    failure = Failure(FailureKind(kind), message, seen.rank, seen.step, seen.cause or message)
    if known_failure is not None:
        failure = known_failure
        kind, message = failure.kind, failure.message
    try:
        lock = RunDirLock(job.run_dir).acquire()
    except RunDirInUse as exc:  # another live job owns the directory (the run refused to start): leave it be
        return failed_return(job.overrides, JobNotRun(str(exc)), job)
    try:
        write_summary(job.run_dir, Summary(Status.FAILED, failure, task_overrides(job), job.task_config, {},
                                           attempt=attempt, written_by="launcher"))
    finally:
        lock.release()
    return failed_return(job.overrides, JobNotRun(f"{kind}: {message}"), job)


# The lines submitit wraps a job's stderr in ("Job X (task: 0) with path ...", "has not produced any
# output (state: S)", "Error stream produced:"): they say nothing the state does not; a cause, if any,
# is in the stderr below them (a rank whose stderr has none adds no detail).
SUBMITIT_FRAMING = ("Job ", "has not produced any output", "Error stream produced:", "No error stream produced")


def _failure_message(found: RankReport | None, state: str, error: BaseException | None, submitted: Any) -> str:
    """The failure message of a job that ended without rank 0's summary.json (`found`: first_failure's)."""
    if found is not None and found.reported_by is not None:  # a rank recorded why
        return found.failure.message
    detail = ""
    if error is not None:
        lines = [ln.strip() for ln in str(error).splitlines() if ln.strip() and not set(ln.strip()) <= {"-"}]
        own = [ln for ln in lines if not ln.startswith(SUBMITIT_FRAMING)]
        causes = [ln for ln in own if "Error" in ln or "error" in ln or "Killed" in ln]
        if causes:
            detail = causes[-1]
        elif len(own) == len(lines):  # not submitit's message: its first line
            detail = lines[0] if lines else type(error).__name__
        detail = detail[:300]
    logs = ""
    try:
        logs = f"; logs: {submitted.paths.folder}"
    except Exception:
        pass
    what = f"job ended without rank 0 writing summary.json (state {state or 'UNKNOWN'})"
    if found is not None:  # rank 0 was killed with the step: srun's log still says which tasks ended first
        what = f"{found.failure.message}; {what}"
    return what + (f": {detail}" if detail else "") + logs


def runs_written(jobs: Sequence[SweepJob], attempts: Sequence[str]) -> int:
    """How many of a started job's runs (one, or a probe batch's in turn) have written this attempt's
    summary.json: the job is on the next one."""
    return next((p for p, (job, attempt) in enumerate(zip(jobs, attempts)) if read_summary(job.run_dir, attempt) is None),
                len(jobs))
