"""Failures a run can end with, each carrying the `failure.kind` written to summary.json."""

from __future__ import annotations

# Every summary.json failure.kind (INTERFACE.md), in one place. `interrupted`: stopped by the terminal
# (Ctrl-C, SIGHUP), with a checkpoint where one could be written; the same command resumes it.
FAILURE_KINDS = ("oom", "nan", "crash", "timeout", "preempted", "interrupted", "invalid_config", "data_error",
                 "hang", "disk_full", "node_failure", "pruned", "oom_predicted")

# How rank 0's failure message starts when it only saw a peer go away (the cause is another rank's).
PEER_STOPPED = "a peer rank stopped"


class RunFailure(Exception):
    """A run that cannot go on. `kind` is one of INTERFACE.md's failure kinds."""

    kind = "crash"

    def __init__(self, message: str, kind: str | None = None):
        super().__init__(message)
        if kind is not None:
            self.kind = kind


class InvalidConfig(RunFailure):
    """A setting that cannot work. The message names the setting and what is accepted."""

    kind = "invalid_config"

    def __init__(self, setting: str, problem: str, accepted: str):
        super().__init__(f"{setting}: {problem} (accepted: {accepted})")
        self.setting = setting


class DataError(RunFailure):
    """Preference data that is missing, malformed or empty."""

    kind = "data_error"


class NonFiniteLoss(RunFailure):
    """A NaN or inf loss (outside fp16 loss-scale skips, which are expected)."""

    kind = "nan"


class RunPruned(RunFailure):
    """The Optuna pruner stopped this trial at an evaluation (dpo_sweeps/train/pruning.py): summary status `pruned`."""

    kind = "pruned"


class DiskFull(RunFailure):
    """No space left (or quota exceeded) where the run writes; the message names the path."""

    kind = "disk_full"


def interrupted_before_training(signal_words: str = "SIGINT (Ctrl-C)") -> dict:
    """The failure of a run stopped by the terminal before its first step: nothing to checkpoint."""
    return failure_of(RunFailure(f"{signal_words} received before training started: nothing to checkpoint; "
                                 "the same command starts the run again", "interrupted"))


def say(line: str) -> None:
    """One line on stderr; a terminal that closed (SIGHUP) is no reason for a traceback."""
    import sys

    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def failure_of(exc: BaseException) -> dict:
    """The summary.json `failure` object for an exception."""
    if isinstance(exc, RunFailure):
        kind = exc.kind
    elif is_disk_full(exc):
        kind = "disk_full"
    elif _is_out_of_memory(exc):
        kind = "oom"
    else:
        kind = "crash"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not isinstance(exc, RunFailure):
        message = f"{type(exc).__name__}: {message}"
    # rank and step: where it happened (null: before the ranks started, or not known); cause: what the
    # failing rank itself reported, without the "rank N:" of `message`.
    return {"kind": kind, "message": message, "rank": None, "step": None, "cause": message}


# Less free space than this where a write failed: the disk is full, whatever the writer said.
NEARLY_FULL_BYTES = 1 << 20


def is_disk_full(exc: BaseException, path=None) -> bool:
    """ENOSPC or EDQUOT, also when a library wrapped it (torch.distributed.checkpoint does), or any
    write error where `path`'s filesystem is (nearly) full: torch.save reports a full disk as
    "unexpected pos"."""
    import errno
    import shutil

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if "no space left on device" in str(exc).lower() or "disk quota exceeded" in str(exc).lower():
        return True
    if path is None:
        return False
    try:
        return shutil.disk_usage(path).free < NEARLY_FULL_BYTES
    except OSError:
        return False


def _is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
