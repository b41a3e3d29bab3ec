"""Stopping a run cleanly on a signal or a wall-time limit: checkpoint, record why, exit.

SIGTERM (scancel, `kill`, a scheduler's notice), the signal submitit asks SLURM to send before a
time limit or a preemption (SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise), and the
terminal's signals, SIGINT (Ctrl-C) and SIGHUP (the terminal closed), only set a flag here. Between
optimizer steps the ranks agree on the flag, save a checkpoint at the step they reached and end the
run failed with kind `preempted`, `interrupted` (a terminal signal) or `timeout`
(`train.time_limit_min` reached). A terminal signal that is ignored when the run starts (`nohup`, a
background job) stays ignored. After SIGHUP the terminal is gone: output goes to /dev/null (the run's
log file keeps it), so that no write to it fails the run.

Under submitit, rank 0 then calls the handler submitit had installed, which requeues the job through
the launcher's `checkpoint()`; the requeued job reruns the same overrides in the same run directory
and resumes from that checkpoint. When submitit does not requeue (time-outs past
`max_num_timeout`), the summary's `timeout`/`preempted` stands.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from dpo_sweeps.errors import RunFailure

log = logging.getLogger(__name__)

# How long a stopped rank of a SLURM job waits for SLURM to end or requeue it (KillWait is 30 s by default).
SLURM_END_WAIT_S = 90.0

# What stopped the run, by priority when ranks saw different things (the largest wins).
NO_STOP, STOP_INTERRUPT, STOP_SIGTERM, STOP_PREEMPT_SIGNAL, STOP_TIME_LIMIT = 0, 1, 2, 3, 4
# The terminal's signals: Ctrl-C, and the terminal closing.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP)
TERMINAL_SIGNAL_WORDS = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGHUP: "SIGHUP (the terminal closed)"}


class RunInterrupted(RunFailure):
    """The run stopped on a signal or its time limit, after saving a checkpoint. kind: preempted | interrupted | timeout."""

    def __init__(self, message: str, *, kind: str, step: int, reason: int):
        super().__init__(message, kind)
        self.step, self.reason = step, reason


def preemption_signal() -> signal.Signals:
    """The signal submitit has SLURM send before a time limit or preemption."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper().removeprefix("SIG")
    return getattr(signal.Signals, "SIG" + name, signal.SIGUSR2)


def stop_signals() -> tuple[signal.Signals, ...]:
    return tuple(dict.fromkeys((signal.SIGTERM, preemption_signal(), *TERMINAL_SIGNALS)))


def _ignored(sig: signal.Signals) -> bool:
    return sig in TERMINAL_SIGNALS and signal.getsignal(sig) == signal.SIG_IGN


@contextmanager
def terminal_signals_ignored() -> Any:
    """Processes started inside start with the terminal's signals ignored (dispositions survive exec):
    their launcher catches those and passes a SIGTERM on, so a Ctrl-C while they import is no traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in TERMINAL_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _detach_from_terminal() -> None:
    """After SIGHUP: stdout and stderr to /dev/null, so that writing to the closed terminal fails nothing."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass


def _is_submitit_handler(handler: Any) -> bool:
    owner = getattr(handler, "__self__", None)
    return owner is not None and type(owner).__module__.startswith("submitit")


class StopRequests:
    """Catches the stop signals and watches the wall-time limit of this process."""

    def __init__(self, time_limit_min: float | None = None):
        self.deadline = time.monotonic() + 60 * time_limit_min if time_limit_min else None
        self.time_limit_min = time_limit_min
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}  # the handlers replaced, kept after uninstall for the hand-over
        self._installed = False

    def install(self, handler: Callable | None = None) -> StopRequests:
        """Take over the stop signals (main thread only; elsewhere the signals keep their handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in stop_signals():
            if not _ignored(sig):
                self._previous[sig] = signal.signal(sig, handler or self._on_signal)
        self._installed = True
        return self

    def uninstall(self) -> None:
        if not self._installed:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._installed = False

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP:
            _detach_from_terminal()
        if self.signum is not None:
            log.warning("received %s: already stopping", signal.Signals(signum).name)
            return
        self.signum = signum
        log.warning("received %s: stopping after this step with a checkpoint", signal.Signals(signum).name)

    def local_reason(self) -> int:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return STOP_TIME_LIMIT
        if self.signum == preemption_signal():
            return STOP_PREEMPT_SIGNAL
        if self.signum in TERMINAL_SIGNALS:
            return STOP_INTERRUPT
        return STOP_SIGTERM if self.signum is not None else NO_STOP

    def agreed_reason(self, world_size: int) -> int:
        """The stop reason of any rank (collective when world_size > 1)."""
        reason = self.local_reason()
        if world_size > 1:
            # Here, not at the top: the process that supervises local ranks reads this module without torch.
            from dpo_sweeps.parallel.distributed import all_reduce

            reason = int(all_reduce([float(reason)], "max")[0])
        return reason

    # ------------------------------------------------------------------ submitit
    @property
    def submitit_handler(self) -> Callable | None:
        handler = self._previous.get(preemption_signal())
        return handler if _is_submitit_handler(handler) else None

    def failure_kind(self, reason: int) -> str:
        if reason == STOP_TIME_LIMIT:
            return "timeout"
        if reason == STOP_INTERRUPT:
            return "interrupted"
        handler = self.submitit_handler
        if reason == STOP_PREEMPT_SIGNAL and handler is not None and handler.__self__.has_timed_out():
            return "timeout"
        return "preempted"

    def describe(self, reason: int) -> str:
        if reason == STOP_TIME_LIMIT:
            return f"train.time_limit_min ({self.time_limit_min:g}) reached"
        if reason == STOP_PREEMPT_SIGNAL:
            return f"{preemption_signal().name} received (time limit or preemption notice)"
        if reason == STOP_INTERRUPT and self.signum not in TERMINAL_SIGNALS:
            return "a peer rank received SIGINT or SIGHUP"
        if self.signum in TERMINAL_SIGNALS:
            return f"{TERMINAL_SIGNAL_WORDS[signal.Signals(self.signum)]} received"
        name = signal.Signals(self.signum).name if self.signum else "a stop signal"
        return f"{name} received" if self.signum else "a peer rank received a stop signal"

    def hand_over_to_submitit(self, reason: int) -> bool:
        """Let submitit's own handler requeue the job. Exits the process (SystemExit) when it does;
        returns False when there is nothing to hand over or submitit declined to requeue."""
        handler = self.submitit_handler
        if handler is None or reason != STOP_PREEMPT_SIGNAL:
            return False
        from submitit.core.utils import UncompletedJobError

        try:
            handler(preemption_signal(), None)
        except UncompletedJobError as exc:
            log.warning("submitit did not requeue the job: %s", exc)
            return False
        return True

    def leave(self, reason: int, *, is_main: bool) -> None:
        """After a stop and its summary: hand the job over to submitit (rank 0), then leave the way a
        SLURM job that is being requeued or ended must leave.

        submitit takes a task that returns as finished (its result file), and a job whose tasks all
        finished as done even when SLURM requeues it. So under SLURM, after a SIGTERM (SLURM is
        cancelling, requeueing or preempting the job) every rank waits for SLURM to end it and never
        returns; after the preemption signal the other ranks wait while rank 0 lets submitit requeue.
        """
        if is_main and self.hand_over_to_submitit(reason):
            return
        if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or reason not in (STOP_SIGTERM, STOP_PREEMPT_SIGNAL):
            return
        if reason == STOP_PREEMPT_SIGNAL and is_main:
            return  # submitit declined to requeue: the job is over, report it
        log.info("waiting up to %.0f s for SLURM to end or requeue the job", SLURM_END_WAIT_S)
        deadline = time.monotonic() + SLURM_END_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(0.5)
        if reason == STOP_SIGTERM:
            raise SystemExit(1)


@contextmanager
def forwarding_stop_signals(processes: list) -> Any:
    """In a launcher process: pass the stop signals on to the rank processes it started.

    Yields a StopRequests whose `signum` says whether a stop signal came, and which remembers the
    handler it replaced (submitit's, when this launcher is itself a submitit task).
    """
    watch = StopRequests()

    def forward(signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP:
            _detach_from_terminal()
        if watch.signum is None:
            watch.signum = signum
        # The ranks ignore the terminal's signals (terminal_signals_ignored): a SIGTERM stops them.
        passed_on = signal.SIGTERM if signum in TERMINAL_SIGNALS else signum
        for proc in processes:
            if proc.is_alive() and proc.pid:
                try:
                    os.kill(proc.pid, passed_on)
                except ProcessLookupError:
                    pass

    watch.install(forward)
    try:
        yield watch
    finally:
        watch.uninstall()


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when the process that started it dies, so no
    rank outlives a killed launcher and keeps writing a run directory it no longer owns."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid != os.getppid():  # it died before prctl took effect
        os._exit(1)
