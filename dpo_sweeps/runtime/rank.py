"""A rank's steps around its training: its threads and cores, the run directory's claim, and whose failure
a failed rank's is (its own, or a peer's that went away first).

`dpo_sweeps.train.lifecycle.run_rank` runs one rank from start to summary.json with these.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import PEER_STOPPED, Failure, FailureKind, RunFailure
from dpo_sweeps.parallel.cpu_binding import OWN_CORES_ENV, rank_cores
from dpo_sweeps.parallel.distributed import all_reduce
from dpo_sweeps.parallel.gpu_driver import wants_cuda
from dpo_sweeps.parallel.plan import resolve_plan
from dpo_sweeps.parallel.rank_env import RankEnv
from dpo_sweeps.rundir.hydra_record import write_hydra_record
from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock
from dpo_sweeps.rundir.paths import is_path_error, unwritable_path
from dpo_sweeps.rundir.rank_failures import first_failure
from dpo_sweeps.rundir.summary import Status
from dpo_sweeps.runtime.context import RunContext
from dpo_sweeps.runtime.owner import prepare_run_dir
from dpo_sweeps.runtime.watchdog import Watchdog

log = logging.getLogger("dpo_sweeps")

# How long rank 0 waits for a failed peer to record why.
PEER_REPORT_WAIT_S = 5.0


def lock_run_dir(ctx: RunContext, env: RankEnv, cfg: Config) -> RunDirLock | None:
    """Rank 0 takes the run directory's lock; every rank raises RunDirInUse when it cannot (collective)."""
    lock, refusal = None, None
    if env.is_main:
        try:
            lock = RunDirLock(ctx.run_dir).acquire()
            write_hydra_record(ctx.run_dir, ctx.hydra_record)
            prepare_run_dir(ctx.run_dir, cfg)
        except RunDirInUse as exc:
            refusal = exc
        except OSError as exc:  # a full or read-only file system: refused, as the peers are told
            if not is_path_error(exc):
                raise
            refusal = unwritable_path(exc, ctx.run_dir, ctx.dir_setting)
            if lock is not None:
                lock.release(refused=True)
    if all_reduce([1.0 if refusal else 0.0], "max")[0]:
        raise refusal or RunDirInUse(ctx.run_dir, {})
    return lock


def oom_context(cfg: Config, env: RankEnv) -> str:
    """The settings that decide memory, for an out-of-memory message."""
    plan = resolve_plan(cfg, env.world_size)
    return (f"model={cfg.model.name_or_path}, plan={plan.label} (fsdp={cfg.fsdp.sharding_strategy}), "
            f"train.batch_size={cfg.train.batch_size}, train.micro_batch_size={cfg.train.micro_batch_size}, "
            f"data.max_length={cfg.data.max_length}, "
            f"fsdp.activation_checkpointing={cfg.fsdp.activation_checkpointing}, ranks={env.world_size}")


def rank_threads(cfg: Config, env: RankEnv, bind_cores: bool) -> int:
    """CPU threads for this rank, after binding it to its own cores when it may (`bind_cores`)."""
    # The cores this process may run on (a launcher may pin each job to its own), not the machine's.
    if hasattr(os, "sched_getaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
    else:
        allowed = list(range(os.cpu_count() or 1))
    own = allowed if os.environ.get(OWN_CORES_ENV) == "1" else None
    if own is not None:
        log.info("rank %d bound to cores %s by the launcher (resources.bind_cores)", env.rank, own)
    on_cpu = not wants_cuda(cfg.resources.device)
    if own is None and bind_cores and cfg.resources.bind_cores and env.local_world_size > 1 and on_cpu:
        own = rank_cores(allowed, env.local_rank, env.local_world_size)
        if own is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, own)
            log.info("rank %d bound to cores %s of %s (resources.bind_cores)", env.rank, own, allowed)
    if cfg.resources.threads_per_rank:
        return int(cfg.resources.threads_per_rank)
    if own is not None:
        return len(own)
    slurm_cpus = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm_cpus.isdigit() and env.local_world_size > 1:  # each SLURM task (rank) has its own CPUs
        return int(slurm_cpus)
    return max(1, len(allowed) // env.local_world_size)


def status_of(failure: Failure | None) -> Status:
    # A pruned trial is no failure of the config: its own status, so sweeps and reports can tell.
    return Status.COMPLETED if failure is None else Status.PRUNED if failure.kind == FailureKind.PRUNED else Status.FAILED


def root_cause(run_dir: Path, own: Failure, watchdog: Watchdog | None, ending: Callable[[], bool]) -> Failure:
    """The failure of the rank that failed first on its own (or hung), rather than rank 0's 'peer went away'.

    Waits up to PEER_REPORT_WAIT_S for that rank's report, less when `ending()` says the process is being
    stopped (a peer killed outright never reports; the launcher then names it from the job's tasks)."""
    deadline = time.monotonic() + PEER_REPORT_WAIT_S
    while True:
        report = first_failure(run_dir)
        found = report.failure if report is not None else watchdog.verdict if watchdog is not None else None
        if found or ending() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not found:  # the launcher may know more (an exit code, SLURM's state): rank stays None for it
        return Failure(FailureKind.CRASH, f"{PEER_STOPPED}: {own.message}", step=own.step, cause=own.cause)
    return found


def is_collective_error(exc: BaseException) -> bool:
    """An error raised because a peer went away (the cause is elsewhere), not by this rank's own work."""
    if isinstance(exc, RunFailure):
        return False
    text = str(exc).lower()
    markers = ("connection closed by peer", "connection reset", "broken pipe", "timed out", "timeout",
               "gloo", "nccl", "socket", "connection refused")
    return isinstance(exc, getattr(dist, "DistError", ())) or any(m in text for m in markers)
