"""Failures a run can end with, each carrying the `failure.kind` written to summary.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dpo_sweeps.redaction import redact_text

# How rank 0's failure message starts when it only saw a peer go away (the cause is another rank's).
PEER_STOPPED = "a peer rank stopped"


class FailureKind(StrEnum):
    """summary.json's `failure.kind` (INTERFACE.md): why a run did not complete."""

    CRASH = "crash"
    OOM = "oom"
    NAN = "nan"
    HANG = "hang"
    DISK_FULL = "disk_full"
    TIMEOUT = "timeout"
    PREEMPTED = "preempted"
    INTERRUPTED = "interrupted"  # stopped by the terminal (Ctrl-C, SIGHUP), checkpointed where it could be
    NODE_FAILURE = "node_failure"
    INVALID_CONFIG = "invalid_config"
    DATA_ERROR = "data_error"
    PRUNED = "pruned"
    OOM_PREDICTED = "oom_predicted"  # a sweep point the fit check did not start (status skipped)


@dataclass(frozen=True)
class Failure:
    """summary.json's `failure`: the one record of why a run did not complete, made by ranks, launchers
    and sweepers alike, and read back by them and the report (`from_json`)."""

    kind: FailureKind
    message: str
    rank: int | None = None
    """The rank where it started; None before the ranks started or when not known."""
    step: int | None = None
    """The optimizer step it was in; None when not known."""
    cause: str | None = None
    """What that rank itself reported, without the `rank N:` that `message` may open with (None: message)."""
    started: bool = True
    """False: a point a launcher or sweeper never started (refused, skipped, not submitted), whose record
    has its kind and message only (INTERFACE.md's first form)."""

    def to_json(self) -> dict:
        """The five fields of a run that failed once it was started, or kind and message (not started)."""
        if not self.started:
            return {"kind": str(self.kind), "message": self.message}
        return {"kind": str(self.kind), "message": self.message, "rank": self.rank, "step": self.step,
                "cause": self.message if self.cause is None else self.cause}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Failure:
        """A failure as summary.json (or a rank's record) has it, in either form; a kind this version does
        not know stays the string it is."""
        kind = record.get("kind") or "crash"
        started = any(key in record for key in ("rank", "step", "cause"))
        return cls(FailureKind(kind) if kind in FAILURE_KINDS else kind, str(record.get("message") or ""),
                   record.get("rank"), record.get("step"), record.get("cause"), started)


# Every failure kind, as summary.json writes it (INTERFACE.md).
FAILURE_KINDS = frozenset(kind.value for kind in FailureKind)


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


def interrupted_before_training(signal_words: str = "SIGINT (Ctrl-C)") -> Failure:
    """The failure of a run stopped by the terminal before its first step: nothing to checkpoint."""
    return failure_of(RunFailure(f"{signal_words} received before training started: nothing to checkpoint; "
                                 "the same command starts the run again", "interrupted"))


def say(line: str) -> None:
    """One line on stderr, secrets redacted (an error may quote the value at fault); a terminal that closed
    (SIGHUP) is no reason for a traceback."""
    import sys

    try:
        print(redact_text(line), file=sys.stderr, flush=True)
    except OSError:
        pass


def failure_of(exc: BaseException) -> Failure:
    """The summary.json `failure` of an exception (rank and step not known here: the rank adds them)."""
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
    return Failure(FailureKind(kind), message)


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
