"""One rank's lifecycle (stage 4 of the road, docs/architecture.md): bind its cores, join the process
group, train, and write what happened.

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
from dpo_sweeps.runtime.signals import RunInterrupted, StopRequests
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
    life = RankLife(ctx, env, claim_run_dir, bind_cores)
    try:
        try:
            life.join()
            trainer = life.build_trainer()
            life.metrics = trainer.fit()
            life.complete()
        except (RunDirInUse, UnwritablePath) as exc:  # refused before anything was written
            return refused_summary(ctx, exc, env.rank)
        except Exception as exc:
            life.fail(exc)
        return life.report()
    finally:
        life.tear_down()


class RankLife:
    """One rank's run in its stages, each a method, in the order `run_rank` calls them:

    1. `__init__`: the process made ready (garbage collector, threads, the stop requests: signals and the time limit);
    2. `join`: the device, the process group, the run directory's lock, the watchdog, the checks that need
       the ranks;
    3. `build_trainer`: the model, data and optimizer set up (`Trainer.setup`); `run_rank` then calls
       `Trainer.fit`, the training loop;
    4. `complete` (when fit returned): save the model, tidy the checkpoints;
    5. `fail` (when 2, 3, fit or 4 raised): the failure order, written once here;
    6. `report`: rank 0 writes the summary and closes the trackers; another rank may take over from a
       lost rank 0; an interrupted run leaves (and may be requeued);
    7. `tear_down`: the process group, the watchdog, the stop requests and the lock, in that order, always.
    """

    def __init__(self, ctx: RunContext, env: RankEnv, claim_run_dir: bool, bind_cores: bool):
        self.ctx, self.env, self.claim_run_dir = ctx, env, claim_run_dir
        # A log handler that cannot write (a full disk) drops its records instead of printing a traceback
        # for each; the run's own log file says so once (rundir/log_file.py), and W&B's debug log says nothing.
        logging.raiseExceptions = False
        if not sharing():
            # What exists now (imported modules, the config) outlives the run: the collections it makes (the
            # freed reference) need not scan it. Not in a probe batch, whose later runs' objects would be
            # frozen with it: sharing_ranks() freezes once, before its first run.
            gc.freeze()
        self.cfg = Config.of(ctx.config)  # typed and frozen: nothing changes it (a probe derives its own, train/probe.py)
        torch.set_num_threads(rank_threads(self.cfg, env, bind_cores))
        self.stops = StopRequests(self.cfg.train.time_limit_min).install()
        self.trainer: Trainer | None = None
        self.watchdog: Watchdog | None = None
        self.lock: RunDirLock | None = None
        self.metrics: dict[str, Any] = {}
        self.failure: Failure | None = None
        self.interrupted: RunInterrupted | None = None
        self.peer_lost = False  # this rank failed only because a peer went away
        self.summary_before: tuple[int, int] | None = None  # the summary.json there before this attempt's

    # ------------------------------------------------------------------ 2. join
    def join(self) -> None:
        ctx, env, cfg = self.ctx, self.env, self.cfg
        self.device = select_device(cfg.resources.device, env.local_rank)
        if not dist.is_initialized():  # the previous run in these processes may have left it up
            init_process_group(env, self.device, cfg.resources.collective_timeout_s)
        if self.claim_run_dir:
            self.lock = lock_run_dir(ctx, env, cfg)
            self.summary_before = summary_version(ctx.run_dir)
        hang_timeout_s = cfg.resources.hang_timeout_s or cfg.resources.collective_timeout_s
        self.watchdog = Watchdog(ctx.run_dir, env.rank, env.world_size, hang_timeout_s, self._on_verdict).start()
        if env.world_size > 1:
            validate_config(cfg, ctx.base_dir)
        check_allocator_in_use(cfg.resources.cpu_allocator)

    # ------------------------------------------------------------------ 3. build the trainer
    def build_trainer(self) -> Trainer:
        trainer = self.trainer = Trainer(self.ctx, self.cfg, self.env, self.device, stop_requests=self.stops,
                                         heartbeat=self.watchdog.progress)
        trainer.setup()
        return trainer

    # ------------------------------------------------------------------ 4. complete
    def complete(self) -> None:
        trainer = self.trainer
        if trainer.cfg.train.save_model:  # the trainer's config: a probe's saves no model
            trainer.save_model()
        self.watchdog.begin_ending()
        if self.env.is_main and not trainer.checkpointer.keep_when_completed:
            remove_checkpoints(self.ctx.run_dir, "the run completed; checkpoint.keep_when_completed=false")

    # ------------------------------------------------------------------ 5. fail
    def fail(self, exc: Exception) -> None:
        """The failure order: the watchdog stops judging; the failure is classified and its message made
        (with the memory context of an OOM, the path and the setting that moves it of a failed write);
        this rank's failure is recorded for the others; rank 0, after a collective error, finds the root
        cause among the ranks' records; the metrics reached so far are kept; the failure is logged."""
        ctx, env, watchdog = self.ctx, self.env, self.watchdog
        if watchdog is not None:
            watchdog.begin_ending()
        failure = self.failure = failure_of(exc)  # set at once: tear_down reads it even if what follows raises
        self.interrupted = exc if isinstance(exc, RunInterrupted) else None
        message = failure.message
        if failure.kind == FailureKind.OOM:
            message += f" [{oom_context(self.cfg, env)}]"
        if failure.kind == FailureKind.DISK_FULL or is_path_error(exc, within=ctx.run_dir):  # the path, what moves it
            message = failed_write_message(exc, message, ctx.run_dir, ctx.dir_setting)
        collective = self.peer_lost = is_collective_error(exc)
        failure = dataclasses.replace(failure, message=message, cause=message,
                                      step=watchdog.step if watchdog is not None else None)
        if env.world_size > 1:
            write_rank_failure(ctx.run_dir, env.rank, failure, collective=collective)
        failure = dataclasses.replace(failure, rank=env.rank)
        if env.is_main and collective:
            # A stop signal now means the job step is being torn down (srun ends a step whose task
            # died, and kills what is left after KillWait): write the summary at once, not after the wait.
            failure = root_cause(ctx.run_dir, failure, watchdog, ending=self._ending)
        if self.trainer is not None and self.trainer.state.step:
            self.metrics = _partial_metrics(self.trainer)
        self.failure = failure
        log.error("rank %d failed: %s", env.rank, failure.message)

    # ------------------------------------------------------------------ 6. report
    def report(self) -> Summary:
        ctx, env, failure = self.ctx, self.env, self.failure
        if not env.is_main:
            if self.interrupted is not None:
                self.stops.leave(self.interrupted.reason, is_main=False)
            if self.peer_lost and self.claim_run_dir and self.watchdog is not None:
                # Rank 0 owns the lock: it may be the one lost.
                take_over_from_lost_rank0(ctx.run_dir, self.watchdog, self.summary_before, failure, env.rank,
                                          lambda lost: self._write_summary(lost, self.metrics), ending=self._ending)
            return Summary(status_of(failure), failure, ctx.overrides, ctx.config, {}, attempt=ctx.attempt,
                           rank=env.rank, written=False)
        summary = self._write_summary(failure, self.metrics)
        if self.trainer is not None:  # the trackers get the status and summary.json once it is written
            summary = self.trainer.close(summary)
        if self.interrupted is not None:
            self.stops.leave(self.interrupted.reason, is_main=True)  # exits here when the job is requeued
        return summary

    # ------------------------------------------------------------------ 7. tear down
    def tear_down(self) -> None:
        # After the summary: with NCCL and a dead peer, tearing the process group down can block.
        # The next run of a probe batch reuses the group (runtime/shared_ranks.py); a failed run ends the batch.
        if dist.is_initialized() and (self.failure is not None or not sharing()):
            dist.destroy_process_group()
        if self.watchdog is not None:
            self.watchdog.stop()
        self.stops.uninstall()
        if self.lock is not None:
            self.lock.release()

    # ------------------------------------------------------------------ helpers
    def _ending(self) -> bool:
        return self.stops.signum is not None

    def _write_summary(self, failure: Failure | None, metrics: dict[str, Any]) -> Summary:
        ctx, trainer = self.ctx, self.trainer
        summary = Summary(status_of(failure), failure, ctx.overrides, ctx.config, metrics, attempt=ctx.attempt,
                          **attempt_cost(ctx))
        if trainer is not None:
            summary = dataclasses.replace(
                summary, resumed_from_step=trainer.resumed_from, data=trainer.setup_summary.data,
                layout=trainer.setup_summary.layout,
                plan=trainer.plan.as_dict(), broken_checkpoints=trainer.broken_checkpoints() or None)
        return write_summary(ctx.run_dir, summary)

    def _on_verdict(self, verdict: Failure) -> None:
        """Rank 0's watchdog, when a peer failed or the run hung (from the watchdog's thread)."""
        trainer = self.trainer
        partial = _partial_metrics(trainer) if trainer is not None and trainer.state.step else {}
        self._write_summary(verdict, partial)
        if multiprocessing.parent_process() is None:  # not one of our local ranks: nobody else will say it
            print(f"error: run failed ({verdict.kind}): {verdict.message}  [{self.ctx.run_dir / 'summary.json'}]",
                  file=sys.stderr, flush=True)


def _partial_metrics(trainer: Trainer) -> dict[str, Any]:
    """What a failed run got to: its last logged values (perf needs the peers, so it is left out)."""
    metrics = {k: v for k, v in trainer.state.last_eval.items() if k != "step"}
    metrics["train/loss"] = trainer.state.last_train.get("train/loss")
    metrics.update({"steps": trainer.state.step, "world_size": trainer.env.world_size})
    return metrics


