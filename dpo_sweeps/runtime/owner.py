"""The process that owns a run directory: what it writes there before any rank starts and when its
ranks could not report (runtime/local_ranks.py, app.py), and what a refused run reports.

Torch-free: the process that starts a run's local ranks only supervises them and never imports the
training stack (dpo_sweeps.train.lifecycle, which each rank runs, uses these too).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import Failure, failure_of
from dpo_sweeps.parallel.gpu_driver import wants_cuda
from dpo_sweeps.rundir.checkpoints import remove_checkpoints, remove_partial_checkpoints
from dpo_sweeps.rundir.cost import run_cost
from dpo_sweeps.rundir.lock import RunDirInUse
from dpo_sweeps.rundir.paths import UnwritablePath
from dpo_sweeps.rundir.rank_failures import RANK_FAILURES
from dpo_sweeps.rundir.summary import Status, Summary, reserve_summary_space, write_summary
from dpo_sweeps.runtime.context import RunContext
from dpo_sweeps.runtime.watchdog import heartbeat_dir


def refused_summary(ctx: RunContext, exc: RunDirInUse | UnwritablePath, rank: int = 0) -> Summary:
    """Another job owns the run directory, or it cannot be written: report it, and write nothing there."""
    return Summary(Status.FAILED, failure_of(exc), ctx.overrides, ctx.config, {}, attempt=ctx.attempt, rank=rank,
                   written=False)


def prepare_run_dir(run_dir: Path, cfg: Config) -> None:
    """What the owner of a run directory does before any rank starts: forget the previous attempt's
    rank failures and heartbeats, drop its half-written checkpoints, and start over when checkpoint.resume is false."""
    shutil.rmtree(run_dir / RANK_FAILURES, ignore_errors=True)
    shutil.rmtree(heartbeat_dir(run_dir), ignore_errors=True)
    reserve_summary_space(run_dir)
    remove_partial_checkpoints(run_dir)
    if not cfg.checkpoint.resume:
        remove_checkpoints(run_dir, "checkpoint.resume=false")


def attempt_cost(ctx: RunContext) -> dict[str, Any]:
    """This attempt's cost fields (rundir/cost.py run_cost) from the config's ranks and device."""
    resources = Config.of(ctx.config).resources
    return run_cost(ctx.started_at, resources.world_size, wants_cuda(resources.device))


def write_failed(ctx: RunContext, failure: Failure) -> Summary:
    """The failed summary.json of a run whose ranks could not report (or never started)."""
    return write_summary(ctx.run_dir, Summary(Status.FAILED, failure, ctx.overrides, ctx.config, {},
                                              attempt=ctx.attempt, **attempt_cost(ctx)))
