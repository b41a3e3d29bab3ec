"""Failures a run can end with, each carrying the `failure.kind` written to summary.json."""

from __future__ import annotations

import logging
import multiprocessing
import warnings
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

    @classmethod
    def worded(cls, setting: str, line: str) -> InvalidConfig:
        """One whose line is already worded, setting first (Hydra's own errors made one line,
        checks/schema_errors.py's one_line_message)."""
        refusal = cls.__new__(cls)
        RunFailure.__init__(refusal, line)
        refusal.setting = setting
        return refusal


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


class FailureOnTheErrorLine(logging.Filter):
    """Keeps a rank's ERROR record of its run's failure off the terminal: the command ends with the one
    `error: run failed (KIND): ...` line that says it (run_end.py), and summary.json keeps it; the run's log
    file, a handler without this filter, keeps the rank's record too."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not record.name.startswith("dpo_sweeps")


class LocalRankFailureOnTheErrorLine(FailureOnTheErrorLine):
    """The same, on the `dpo_sweeps` logger, for a local rank (a process multiprocessing started:
    dpo_sweeps/runtime/local_ranks.py), whose basicConfig replaces its handlers and which has no log file:
    the process that started it says the failure once. Asked when a record is logged, as multiprocessing
    knows a process's parent only once the process has imported its modules."""

    def filter(self, record: logging.LogRecord) -> bool:
        return multiprocessing.parent_process() is None or super().filter(record)


# Third-party warnings about the libraries' own calls, which no setting of a run changes, each matched by
# its exact words (and the module that warns), so that any other warning, one naming a setting of the
# user's above all, is still shown: (category, message regex, module regex).
THIRD_PARTY_WARNINGS = (
    # peft's PeftModel reads the deprecated property of every model it wraps (peft=lora, qlora).
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated", r"transformers\.modeling_utils"),
)
# Third-party log records of the same kind, per logger: (logger, message start).
THIRD_PARTY_LOG_RECORDS = (
    # bitsandbytes' CPU backend, imported with peft on a CPU with AVX-512 BF16, looks for an optional
    # 4-bit kernel on the hub at import, whatever the run's peft (only peft=qlora runs 4-bit layers).
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward"),
)


class _ThirdPartyRecord(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet_third_party() -> None:
    """Filters THIRD_PARTY_WARNINGS and THIRD_PARTY_LOG_RECORDS in this process, and a local rank's record
    of its failure (LocalRankFailureOnTheErrorLine); once (again: no effect)."""
    for category, message, module in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, start in THIRD_PARTY_LOG_RECORDS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ThirdPartyRecord) and f.start == start for f in logger.filters):
            logger.addFilter(_ThirdPartyRecord(start))
    logger = logging.getLogger("dpo_sweeps")
    if not any(isinstance(f, LocalRankFailureOnTheErrorLine) for f in logger.filters):
        logger.addFilter(LocalRankFailureOnTheErrorLine())


# Every process that trains imports this module before it builds a model (the Hydra task, a local or
# torchrun rank, a submitit job, a program calling dpo_sweeps.api): the filters are in place for each.
quiet_third_party()
