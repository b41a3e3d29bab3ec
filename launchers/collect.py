"""Collecting a launched job's results: each run's JobReturn, and a failed summary.json for a run whose
rank 0 wrote none for this attempt (a rank killed, a timeout, a preemption, a node failure), so that
every launched run has one. The local and SLURM launchers call `collect_unit` for each job that ended.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.launchers.base import JobNotRun, failed_return, task_overrides
from dpo_sweeps.launchers.jobs import SweepJob
from dpo_sweeps.launchers.slurm.forensics import STATE_KINDS, ended_in_srun_log, name_the_dead_rank, state_of
from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock
from dpo_sweeps.rundir.rank_failures import FAILURE_FIELDS, first_failure
from dpo_sweeps.rundir.summary import SUMMARY, read_summary, write_summary


def collect_unit(jobs: Sequence[SweepJob], submitted: Any, started: float,
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
        collected.append(collect(job, submitted, started, earlier, timeout_min, known_failure, ret, error))
        if ret is None and not fresh:  # the job died in this run (or just before it)
            return collected, list(range(pos + 1, len(jobs)))
    return collected, []


def collect(job: SweepJob, submitted: Any, started: float, earlier_summary: int | None,
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
