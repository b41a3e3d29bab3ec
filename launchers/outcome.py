"""The end of a sweep: what each point came to, on one screen, and the exit status.

Each point's outcome is read from its run's summary.json (the contract every launcher honours);
a job that died without one is reported from what its launcher saw. `SweepFailed` makes
`python -m dpo_sweeps -m ...` exit nonzero after the screen is printed.
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException

from dpo_sweeps.launchers.jobs import PointLabels, SweepJob
from dpo_sweeps.rundir.cost import device_time_text
from dpo_sweeps.rundir.summary import Status, read_summary

MAX_FAILED_LISTED = 20


class SweepFailed(CompactHydraException):
    """Raised after the end-of-sweep screen when any run failed."""


@dataclass
class Outcome:
    job: SweepJob
    # completed | failed | pruned (stopped by the Optuna pruner) | skipped (not started: predicted out of
    # memory) | reused (completed by an earlier invocation)
    status: str
    run_dir: Path
    kind: str | None = None
    message: str | None = None


def outcome_of(job: SweepJob, job_return: JobReturn | None) -> Outcome:
    """What a launched job came to, from its summary.json, else from its JobReturn."""
    summary = read_summary(job.run_dir)
    if summary is not None:
        failure = summary.failure
        return Outcome(job, str(summary.status), job.run_dir, failure and str(failure.kind), failure and failure.message)
    if job_return is not None and job_return.status == JobStatus.COMPLETED:
        # A launcher whose task function wrote no summary (not dpo_sweeps.task.run): trust the return.
        return Outcome(job, "completed", job.run_dir)
    reason = job_return._return_value if job_return is not None else None
    text = str(reason).strip() if reason is not None else ""
    message = text.splitlines()[0] if text else "ended without summary.json"
    return Outcome(job, "failed", job.run_dir, "crash", message)


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def sweep_cost(outcomes: Sequence[Outcome]) -> tuple[dict[str, float], dict[str, float]]:
    """Device-seconds the sweep's runs spent (by device kind), and estimates of what it saved:
    points the fit check did not start (at the median cost of the runs that completed) and the rest of
    the pruned trials (their cost so far, scaled to train.max_steps)."""
    spent: dict[str, float] = {}
    completed: list[float] = []
    saved = {"fit_check": 0.0, "pruning": 0.0}
    skipped = 0
    for o in outcomes:
        summary = read_summary(o.run_dir)
        if o.status == "skipped":
            skipped += 1
        if summary is None or not isinstance(summary.device_seconds, (int, float)):
            continue
        seconds = summary.device_seconds
        kind = summary.device_kind or "cpu"
        spent[kind] = spent.get(kind, 0.0) + seconds
        if summary.status == Status.COMPLETED:
            completed.append(seconds)
        steps = summary.metrics.get("steps")
        max_steps = (summary.config.get("train") or {}).get("max_steps")
        if summary.status == Status.PRUNED and steps and max_steps:
            saved["pruning"] += seconds * (max_steps / steps - 1)
    if skipped and completed:
        saved["fit_check"] = skipped * sorted(completed)[len(completed) // 2]
    return spent, saved


def cost_lines(outcomes: Sequence[Outcome]) -> list[str]:
    spent, saved = sweep_cost(outcomes)
    lines = [f"cost       {device_time_text(spent)} (ranks x wall time, summed over runs)"]
    notes = [f"~{saved['fit_check']:.0f} by the fit check" if saved["fit_check"] else "",
             f"~{saved['pruning']:.0f} by pruning" if saved["pruning"] else ""]
    if any(notes):
        lines.append(f"saved      {', '.join(n for n in notes if n)} device-seconds (estimated)")
    return lines


RETRY_HINT = "Run the same command again to retry the failed runs; completed runs are skipped."


def sweep_screen(sweep_dir: Path, outcomes: Sequence[Outcome], *, title: str = "sweep",
                 retry_hint: str = RETRY_HINT) -> str:
    """Counts, where the results are, which runs failed and why."""
    counts = Counter(o.status for o in outcomes)
    failed = [o for o in outcomes if o.status == "failed"]
    kinds = Counter(o.kind or "crash" for o in failed)
    where = _relative(sweep_dir)
    lines = [
        "",
        f"===== {title} {where}: {len(outcomes)} runs =====",
        f"completed  {counts['completed'] + counts['reused']}"
        + (f"  ({counts['reused']} skipped: completed by an earlier invocation)" if counts["reused"] else ""),
        f"failed     {len(failed)}" + (f"  ({', '.join(f'{k}: {n}' for k, n in sorted(kinds.items()))})"
                                       if failed else ""),
        *([f"pruned     {counts['pruned']}  (stopped early by the Optuna pruner)"] if counts["pruned"] else []),
        *([f"skipped    {counts['skipped']}  (predicted out of memory, not started)"] if counts["skipped"] else []),
        *cost_lines(outcomes),
        f"results    {where}/<run>/summary.json, metrics.jsonl",
        # The console script: a wheel has no analysis/report.py to run, an editable install has both.
        f"report     dpo-sweeps-report {shlex.quote(str(where))}",
    ]
    label = PointLabels([o.job.overrides for o in outcomes])
    skipped = [o for o in outcomes if o.status == "skipped"]
    if skipped:
        lines.append("skipped runs (oom_predicted):")
        for o in skipped[:MAX_FAILED_LISTED]:
            lines.append(f"  #{o.job.num}  {label(o.job.overrides)}")
            lines.append(f"        {o.message}")
    if failed:
        lines.append("failed runs:")
        for o in failed[:MAX_FAILED_LISTED]:
            lines.append(f"  #{o.job.num}  {label(o.job.overrides)}")
            lines.append(f"        {o.kind or 'crash'}: {o.message or '(no message)'}")
            lines.append(f"        {_relative(o.run_dir)}")
        if len(failed) > MAX_FAILED_LISTED:
            lines.append(f"  ... and {len(failed) - MAX_FAILED_LISTED} more (see the report)")
        lines.append(retry_hint)
    lines.append("=" * len(lines[1]))
    return "\n".join(lines)


def raise_if_failed(outcomes: Sequence[Outcome]) -> None:
    failed = sum(o.status == "failed" for o in outcomes)
    if failed:
        raise SweepFailed(f"{failed} of {len(outcomes)} runs failed (listed above)")
