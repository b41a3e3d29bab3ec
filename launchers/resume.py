"""Resume a sweep into its own directory: skip the runs that completed, run the rest.

A point is done when some run directory under the sweep directory has a summary.json that says
`completed` with the point's `config_hash`, wherever that directory is (the grid may have been
reordered or extended since). Other points run in their own numbered directory; when that
directory holds a different run (another config), the point gets the next free number instead.
A failed or interrupted earlier attempt of the same point is run again in its own directory,
where the run itself picks up from its latest checkpoint (dpo_sweeps.rundir.checkpoints).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dpo_sweeps.launchers.jobs import SweepJob
from dpo_sweeps.rundir.lock import LOCK, RunDirInUse, RunDirLock
from dpo_sweeps.rundir.summary import SUMMARY, Status, read_summary


@dataclass
class PendingJobs:
    """A sweep's jobs once completed runs are set aside: what a launch starts (a resume's remainder)."""

    to_run: list[SweepJob] = field(default_factory=list)
    # (job, directory of its completed run) for points that are skipped.
    skipped: list[tuple[SweepJob, Path]] = field(default_factory=list)


def completed_runs(sweep_dir: Path) -> dict[str, Path]:
    """config_hash -> run directory, for every completed run under sweep_dir (hidden folders skipped)."""
    found: dict[str, Path] = {}
    if not sweep_dir.is_dir():
        return found
    for root, dirs, files in os.walk(sweep_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if SUMMARY not in files:
            continue
        summary = read_summary(Path(root))
        if summary is not None and summary.status == Status.COMPLETED and summary.config_hash:
            found.setdefault(summary.config_hash, Path(root))
    return found


def _holds_other_run(run_dir: Path, job: SweepJob) -> bool:
    """True when run_dir belongs to a different config than job's (so job must not write there)."""
    if not run_dir.exists():
        return False
    summary = read_summary(run_dir)
    if summary is not None:
        return summary.config_hash != job.config_hash
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    if overrides_file.exists():
        try:
            return list(yaml.safe_load(overrides_file.read_text()) or []) != list(job.overrides)
        except (OSError, yaml.YAMLError):
            return True
    return any(run_dir.iterdir())


def pending_jobs(jobs: list[SweepJob], sweep_dir: Path, *, skip_completed: bool = True) -> PendingJobs:
    """Which jobs run (renumbered where their directory holds another run) and which are skipped."""
    done = completed_runs(sweep_dir) if skip_completed else {}
    pending = PendingJobs()
    taken = {job.run_dir for job in jobs}
    next_num = max([job.num for job in jobs] + _numbered_children(sweep_dir), default=-1) + 1
    for job in jobs:
        if job.config_hash in done:
            pending.skipped.append((job, done[job.config_hash]))
            continue
        if _holds_other_run(job.run_dir, job):
            moved = job.renumbered(next_num)
            while (moved.run_dir in taken or moved.run_dir.exists()) and moved.run_dir != job.run_dir:
                next_num += 1
                moved = moved.renumbered(next_num)
            # A subdir that does not depend on the job number (e.g. override_dirname) keeps its
            # directory: the run there is replaced.
            job = moved
            next_num += 1
            taken.add(job.run_dir)
        pending.to_run.append(job)
    return pending


def _numbered_children(sweep_dir: Path) -> list[int]:
    if not sweep_dir.is_dir():
        return []
    return [int(p.name) for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()]


def wait_for_earlier_runs(pending: PendingJobs, timeout_s: float = 300.0, poll_s: float = 0.5) -> None:
    """Wait until no run directory of the pending jobs is held by a live process: the runs of a sweep
    that was killed stop by themselves (launchers/local.py), saving a checkpoint the new attempt resumes
    from; started before they let go, it would be refused. A run that completed meanwhile is skipped."""
    held = [job for job in pending.to_run if (job.run_dir / LOCK).exists() and _in_use(job.run_dir)]
    if not held:
        return
    logging.getLogger("launchers").info("waiting for %d runs of an earlier invocation to stop (%s)", len(held),
                                        ", ".join(f"#{job.num}" for job in held[:10]))
    deadline = time.monotonic() + timeout_s
    waiting = list(held)
    while waiting and time.monotonic() < deadline:
        time.sleep(poll_s)
        waiting = [job for job in waiting if _in_use(job.run_dir)]
    for job in held:
        summary = read_summary(job.run_dir)
        if summary is not None and summary.status == Status.COMPLETED and summary.config_hash == job.config_hash:
            pending.to_run.remove(job)
            pending.skipped.append((job, job.run_dir))


def _in_use(run_dir: Path) -> bool:
    try:
        RunDirLock(run_dir).acquire().release()
    except RunDirInUse:
        return True
    return False
