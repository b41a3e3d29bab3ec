"""The progress screen of a running sweep: one line per run as its job ends, from its summary.json.

The local and SLURM launchers log it as they collect each job (`[3/8] #2 completed in 41 s, accuracy
0.912`); the end-of-sweep screen is launchers/outcome.py's.
"""

from __future__ import annotations

from hydra.core.utils import JobReturn, JobStatus

from dpo_sweeps.launchers.jobs import SweepJob
from dpo_sweeps.rundir.summary import read_summary


def progress_line(job: SweepJob, ret: JobReturn, elapsed: float, done: int, total: int) -> str:
    summary = read_summary(job.run_dir) or {}
    if ret.status == JobStatus.COMPLETED and summary.get("status", "completed") == "completed":
        acc = (summary.get("metrics") or {}).get("eval/rewards/accuracies")
        extra = f", accuracy {acc:.3f}" if isinstance(acc, (int, float)) else ""
        return f"[{done}/{total}] #{job.num} completed in {elapsed:.0f} s{extra}"
    failure = summary.get("failure") or {}
    reason = failure.get("kind") or "crash"
    message = failure.get("message") or str(ret._return_value)
    return f"[{done}/{total}] #{job.num} FAILED ({reason}) in {elapsed:.0f} s: {message}"
