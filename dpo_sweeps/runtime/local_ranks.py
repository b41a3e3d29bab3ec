"""Local rank processes: `python -m dpo_sweeps resources.nproc_per_node=N` starts N ranks on this
machine and supervises them. A rank that fails takes the others down (their watchdogs end them
within seconds; any still running after RANK_EXIT_GRACE_S are killed); when rank 0 could not write
summary.json, this process writes it from the ranks' failure records and exit codes.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import pickle
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.parallel.allocator import run_allocator, starting_processes_with
from dpo_sweeps.parallel.rank_env import RankEnv, free_port
from dpo_sweeps.rundir.rank_failures import first_failure
from dpo_sweeps.rundir.summary import Status, Summary, read_summary, rewrite_summary
from dpo_sweeps.runtime.context import RunContext
from dpo_sweeps.runtime.owner import write_failed
from dpo_sweeps.runtime.signals import (
    STOP_INTERRUPT,
    STOP_PREEMPT_SIGNAL,
    STOP_SIGTERM,
    TERMINAL_SIGNAL_WORDS,
    TERMINAL_SIGNALS,
    die_with_parent,
    forwarding_stop_signals,
    preemption_signal,
    terminal_signals_ignored,
)
from dpo_sweeps.runtime.watchdog import heartbeat_dir

log = logging.getLogger("dpo_sweeps")

# How long the other ranks get to exit after one failed, before they are killed.
RANK_EXIT_GRACE_S = 15.0


def rank_process(ctx: RunContext, env: RankEnv, run_rank: Callable) -> None:
    """One local rank, in a process of its own (started by train.entry.start_rank, which imported
    the training stack and `run_rank` with it)."""
    die_with_parent()
    logging.basicConfig(level=logging.INFO if env.is_main else logging.WARNING,
                        format=f"[%(asctime)s][rank{env.rank}][%(levelname)s] %(message)s", force=True)
    summary = run_rank(ctx, env, bind_cores=True)
    sys.exit(0 if summary.status == Status.COMPLETED else 1)


def spawn_local_ranks(ctx: RunContext, cfg: Config, start_rank: Callable[[bytes], None]) -> Summary:
    """Start one process per rank on this machine (cfg.world_size of them); a rank that dies takes the others down.
    `start_rank`: each rank process's entry, given its pickled (ctx, env) (dpo_sweeps/train/entry.py)."""
    world_size = cfg.world_size
    port = cfg.resources.master_port or free_port()
    if cfg.resources.master_port is None:
        log.info("rendezvous on 127.0.0.1:%d (set resources.master_port to choose)", port)
    mp = multiprocessing.get_context("spawn")
    procs: list = []
    # SIGTERM and the preemption signal go on to the ranks, which checkpoint and stop together; so do
    # Ctrl-C and SIGHUP, as a SIGTERM: the ranks start ignoring the terminal's signals.
    with forwarding_stop_signals(procs) as watch:
        with terminal_signals_ignored(), starting_processes_with(run_allocator(cfg.resources)):
            for rank in range(world_size):
                env = RankEnv(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
                              master_addr="127.0.0.1", master_port=port)
                proc = mp.Process(target=start_rank, args=(pickle.dumps((ctx, env)),), name=f"rank{rank}")
                proc.start()
                procs.append(proc)
        _wait_for_ranks(procs)
    shutil.rmtree(heartbeat_dir(ctx.run_dir), ignore_errors=True)  # those of ranks that were killed

    summary = read_summary(ctx.run_dir, attempt=ctx.attempt)
    if summary is None:  # rank 0 wrote none for this attempt
        failure = _failure_from_exit_codes(ctx.run_dir, procs)
        if watch.signum is not None and failure.kind == FailureKind.CRASH:  # the ranks died of the signal itself
            words = TERMINAL_SIGNAL_WORDS.get(watch.signum, signal.Signals(watch.signum).name)
            kind = FailureKind.INTERRUPTED if watch.signum in TERMINAL_SIGNALS else FailureKind.PREEMPTED
            failure = dataclasses.replace(failure, kind=kind, message=f"{words} received; {failure.message}")
        return write_failed(ctx, failure)
    killed = [p for p in procs if p.exitcode is not None and p.exitcode < 0]
    if summary.status == Status.FAILED and killed and summary.failure.started and summary.failure.rank is None:
        # Rank 0 only saw its peer vanish; the exit codes say how.
        found = _failure_from_exit_codes(ctx.run_dir, killed)
        summary = rewrite_summary(ctx.run_dir, summary,
                                  failure=dataclasses.replace(found, step=found.step or summary.failure.step))
    failure = summary.failure
    if watch.signum is not None and failure is not None and failure.kind in ("preempted", "timeout"):
        # This launcher may be a submitit task: submitit judges time-out or preemption, and requeues.
        # The ranks got a terminal signal as a SIGTERM: say which it was.
        reason = (STOP_PREEMPT_SIGNAL if watch.signum == preemption_signal()
                  else STOP_INTERRUPT if watch.signum in TERMINAL_SIGNALS else STOP_SIGTERM)
        kind = watch.failure_kind(reason) if failure.kind == FailureKind.PREEMPTED else failure.kind
        if kind != failure.kind:
            said = f"{TERMINAL_SIGNAL_WORDS.get(watch.signum, 'SIGTERM')} received"
            summary = rewrite_summary(ctx.run_dir, summary, failure=dataclasses.replace(
                failure, kind=FailureKind(kind), message=failure.message.replace("SIGTERM received", said),
                cause=(failure.cause or "").replace("SIGTERM received", said)))
        watch.leave(reason, is_main=True)  # exits here when the job is requeued
    return summary


def _wait_for_ranks(procs: list) -> None:
    """Until every rank has exited; once one fails, the others get RANK_EXIT_GRACE_S to follow."""
    first_failure_at = None
    try:
        while any(p.is_alive() for p in procs):
            if first_failure_at is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure_at = time.monotonic()
            if first_failure_at is not None and time.monotonic() - first_failure_at > RANK_EXIT_GRACE_S:
                for p in procs:
                    if p.is_alive():
                        p.kill()
            time.sleep(0.2)
    except BaseException:
        for p in procs:
            if p.is_alive():
                p.kill()
        raise
    finally:
        for p in procs:
            p.join()


def _failure_from_exit_codes(run_dir: Path, procs: list) -> Failure:
    """The first failed rank's failure: its own record, else the first rank that exited abnormally."""
    ended = [
        (rank, f"rank {rank} killed by {signal.Signals(-code).name}" if code < 0 else f"rank {rank} exited with {code}")
        for rank, code in ((int(p.name.removeprefix("rank")), p.exitcode) for p in procs) if code
    ]
    found = first_failure(run_dir, ended)
    if found is not None:
        return found.failure
    return Failure(FailureKind.CRASH, "rank 0 ended without writing summary.json")
