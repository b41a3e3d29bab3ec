"""One rank's lifecycle: bind its cores, join the process group, train, and write what happened.

`run_rank` runs on every rank (under torchrun, a multi-task submitit job, the local rank supervisor
`dpo_sweeps.runtime.local_ranks`, or alone in the Hydra task's process). Rank 0 writes metrics.jsonl
and summary.json, for failed runs too; every rank runs a watchdog (`dpo_sweeps.runtime.watchdog`)
that ends a failed or hung run. When rank 0 itself dies outright, a surviving rank writes the failed
summary in its place (`dpo_sweeps.runtime.lost_rank0`).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import multiprocessing
import sys
from typing import Any

import torch
import torch.distributed as dist

from dpo_sweeps.checks.validate import validate_config
from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import Failure, FailureKind, failure_of
from dpo_sweeps.parallel.allocator import check_allocator_in_use
from dpo_sweeps.parallel.distributed import init_process_group, select_device
from dpo_sweeps.parallel.rank_env import RankEnv
from dpo_sweeps.rundir.checkpoints import remove_checkpoints
from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock
from dpo_sweeps.rundir.paths import UnwritablePath, failed_write_message, is_path_error
from dpo_sweeps.rundir.rank_failures import write_rank_failure
from dpo_sweeps.rundir.summary import Summary, write_summary
from dpo_sweeps.runtime.context import RunContext
from dpo_sweeps.runtime.lost_rank0 import summary_version, take_over_from_lost_rank0
from dpo_sweeps.runtime.owner import attempt_cost, refused_summary
from dpo_sweeps.runtime.rank import is_collective_error, lock_run_dir, oom_context, rank_threads, root_cause, status_of
from dpo_sweeps.runtime.shared_ranks import sharing
from dpo_sweeps.runtime.signals import RunInterrupted, StopWatch
from dpo_sweeps.runtime.watchdog import Watchdog
from dpo_sweeps.train.trainer import Trainer

log = logging.getLogger("dpo_sweeps")


def run_rank(ctx: RunContext, env: RankEnv, claim_run_dir: bool = False, bind_cores: bool = False) -> Summary:
    """Train as rank `env.rank`. Rank 0 writes and returns the summary; other ranks return what they
    saw (`status`, their own `failure`, and `rank`), writing nothing but their failure record.

    `claim_run_dir`: rank 0 takes the run directory's lock here (torchrun, multi-task submitit jobs);
    otherwise the caller holds it. `bind_cores`: the caller started all local ranks with the same cores
    (so each may take its own block of them, `resources.bind_cores`); torchrun and SLURM tasks leave
    binding to their launcher (`srun --cpu-bind`).
    """
    # A log handler that cannot write (a full disk) drops its records instead of printing a traceback for
    # each; the run's own log file says so once (rundir/log_file.py), and W&B's debug log says nothing.
    logging.raiseExceptions = False
    if not sharing():
        # What exists now (imported modules, the config) outlives the run: the collections it makes (the
        # freed reference) need not scan it. Not in a probe batch, whose later runs' objects would be
        # frozen with it (even this frame's cells): sharing_ranks() freezes once, before its first run.
        gc.freeze()
    cfg = Config.of(ctx.config)  # typed and frozen: nothing changes it (a probe derives its own, train/probe.py)
    torch.set_num_threads(rank_threads(cfg, env, bind_cores))
    watch = StopWatch(cfg.train.time_limit_min).install()
    trainer: Trainer | None = None
    watchdog: Watchdog | None = None
    lock: RunDirLock | None = None
    metrics: dict[str, Any] = {}
    failure = None
    interrupted: RunInterrupted | None = None
    peer_lost = False  # this rank failed only because a peer went away
    summary_before: tuple[int, int] | None = None  # the summary.json there before this attempt's

    def summary_of(failure: Failure | None, metrics: dict[str, Any]) -> Summary:
        summary = Summary(status_of(failure), failure, ctx.overrides, ctx.config, metrics, attempt=ctx.attempt,
                          **attempt_cost(ctx))
        if trainer is not None:
            summary = dataclasses.replace(
                summary, resumed_from_step=trainer.resumed_from, data=trainer.setup_summary.data,
                layout=trainer.setup_summary.layout,
                plan=trainer.plan.as_dict(), broken_checkpoints=trainer.broken_checkpoints() or None)
        return write_summary(ctx.run_dir, summary)

    def on_verdict(verdict: Failure) -> None:  # rank 0's watchdog, when a peer failed or the run hung
        partial = _partial_metrics(trainer) if trainer is not None and trainer.state.step else {}
        summary_of(verdict, partial)
        if multiprocessing.parent_process() is None:  # not one of our local ranks: nobody else will say it
            print(f"error: run failed ({verdict.kind}): {verdict.message}  [{ctx.run_dir / 'summary.json'}]",
                  file=sys.stderr, flush=True)

    try:
        try:
            device = select_device(cfg.resources.device, env.local_rank)
            if not dist.is_initialized():  # the previous run in these processes may have left it up
                init_process_group(env, device, cfg.resources.collective_timeout_s)
            if claim_run_dir:
                lock = lock_run_dir(ctx, env, cfg)
                summary_before = summary_version(ctx.run_dir)
            hang_timeout_s = cfg.resources.hang_timeout_s or cfg.resources.collective_timeout_s
            watchdog = Watchdog(ctx.run_dir, env.rank, env.world_size, hang_timeout_s, on_verdict).start()
            if env.world_size > 1:
                validate_config(cfg, ctx.base_dir)
            check_allocator_in_use(cfg.resources.cpu_allocator)
            trainer = Trainer(ctx, cfg, env, device, stop_watch=watch, heartbeat=watchdog.progress)
            trainer.setup()
            metrics = trainer.fit()
            if trainer.cfg.train.save_model:  # the trainer's config: a probe's saves no model
                trainer.save_model()
            watchdog.begin_ending()
            if env.is_main and not trainer.checkpointer.keep_when_completed:
                remove_checkpoints(ctx.run_dir, "the run completed; checkpoint.keep_when_completed=false")
        except (RunDirInUse, UnwritablePath) as exc:
            return refused_summary(ctx, exc, env.rank)
        except Exception as exc:
            if watchdog is not None:
                watchdog.begin_ending()
            failure = failure_of(exc)
            interrupted = exc if isinstance(exc, RunInterrupted) else None
            message = failure.message
            if failure.kind == FailureKind.OOM:
                message += f" [{oom_context(cfg, env)}]"
            if failure.kind == FailureKind.DISK_FULL or is_path_error(exc, within=ctx.run_dir):  # the path, what moves it
                message = failed_write_message(exc, message, ctx.run_dir, ctx.dir_setting)
            collective = peer_lost = is_collective_error(exc)
            failure = dataclasses.replace(failure, message=message, cause=message,
                                          step=watchdog.step if watchdog is not None else None)
            if env.world_size > 1:
                write_rank_failure(ctx.run_dir, env.rank, failure, collective=collective)
            failure = dataclasses.replace(failure, rank=env.rank)
            if env.is_main and collective:
                # A stop signal now means the job step is being torn down (srun ends a step whose task
                # died, and kills what is left after KillWait): write the summary at once, not after the wait.
                failure = root_cause(ctx.run_dir, failure, watchdog, ending=lambda: watch.signum is not None)
            if trainer is not None and trainer.state.step:
                metrics = _partial_metrics(trainer)
            log.error("rank %d failed: %s", env.rank, failure.message)
        if not env.is_main:
            if interrupted is not None:
                watch.leave(interrupted.reason, is_main=False)
            if peer_lost and claim_run_dir and watchdog is not None:  # rank 0 owns the lock: it may be the one lost
                take_over_from_lost_rank0(ctx.run_dir, watchdog, summary_before, failure, env.rank,
                                          lambda lost: summary_of(lost, metrics), ending=lambda: watch.signum is not None)
            return Summary(status_of(failure), failure, ctx.overrides, ctx.config, {}, attempt=ctx.attempt,
                           rank=env.rank, written=False)
        summary = summary_of(failure, metrics)
        if trainer is not None:  # the trackers get the status and summary.json once it is written
            summary = trainer.close(summary)
        if interrupted is not None:
            watch.leave(interrupted.reason, is_main=True)  # exits here when the job is requeued
        return summary
    finally:
        # After the summary: with NCCL and a dead peer, tearing the process group down can block.
        # The next run of a probe batch reuses the group (runtime/shared_ranks.py); a failed run ends the batch.
        if dist.is_initialized() and (failure is not None or not sharing()):
            dist.destroy_process_group()
        if watchdog is not None:
            watchdog.stop()
        watch.uninstall()
        if lock is not None:
            lock.release()


def _partial_metrics(trainer: Trainer) -> dict[str, Any]:
    """What a failed run got to: its last logged values (perf needs the peers, so it is left out)."""
    metrics = {k: v for k, v in trainer.state.last_eval.items() if k != "step"}
    metrics["train/loss"] = trainer.state.last_train.get("train/loss")
    metrics.update({"steps": trainer.state.step, "world_size": trainer.env.world_size})
    return metrics


