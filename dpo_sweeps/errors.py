"""Failures a run can end with, each carrying the `failure.kind` written to summary.json."""

from __future__ import annotations


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
    """The Optuna pruner stopped this trial at an evaluation (dpo_sweeps/pruning.py): summary status `pruned`."""

    kind = "pruned"


class PeerFailure(RunFailure):
    """Another rank failed; this rank stopped because of it."""

    kind = "crash"


FAILURE_KINDS = ("oom", "nan", "crash", "timeout", "preempted", "node_failure", "invalid_config", "data_error")


def failure_of(exc: BaseException) -> dict:
    """The summary.json `failure` object for an exception."""
    if isinstance(exc, RunFailure):
        kind = exc.kind
    elif _is_out_of_memory(exc):
        kind = "oom"
    else:
        kind = "crash"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not isinstance(exc, RunFailure):
        message = f"{type(exc).__name__}: {message}"
    return {"kind": kind, "message": message}


def _is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
