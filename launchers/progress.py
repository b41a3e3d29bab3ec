"""The progress screen of a running sweep: one line per run as its job ends, from its summary.json.

The local and SLURM launchers log it as they collect each job (`[3/8] #2 completed in 41 s, accuracy
0.912`); the end-of-sweep screen is launchers/outcome.py's.
"""

from __future__ import annotations

from hydra.core.utils import JobReturn, JobStatus

from dpo_sweeps.launchers.jobs import SweepJob
from dpo_sweeps.rundir.summary import Status, read_summary


def progress_line(job: SweepJob, ret: JobReturn, elapsed: float, done: int, total: int) -> str:
    summary = read_summary(job.run_dir)
    if ret.status == JobStatus.COMPLETED and (summary is None or summary.status == Status.COMPLETED):
        acc = summary.metrics.get("eval/rewards/accuracies") if summary is not None else None
        extra = f", accuracy {acc:.3f}" if isinstance(acc, (int, float)) else ""
        return f"[{done}/{total}] #{job.num} completed in {elapsed:.0f} s{extra}"
    failure = summary.failure if summary is not None else None
    reason = failure.kind if failure is not None else "crash"
    message = (failure.message if failure is not None else "") or str(ret._return_value)
    return f"[{done}/{total}] #{job.num} FAILED ({reason}) in {elapsed:.0f} s: {message}"
