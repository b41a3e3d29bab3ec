"""Fault injection for tests: `faults.kind` (config/schema.py FAULT_KINDS) at optimizer step
`faults.step` on rank `faults.rank` (conf/config.yaml). Faults hit only an attempt that started from
step 0, so running the same command again shows the recovery.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

def _due(fault, step: int, rank: int, resumed: bool) -> bool:
    return bool(fault) and bool(fault.kind) and step == fault.step and rank == fault.rank and not resumed


def inject_in_step(fault, step: int, rank: int, loss: torch.Tensor, resumed: bool) -> torch.Tensor:
    """In training step `step` (1-based), after the forward pass: the loss, or the fault instead."""
    if not _due(fault, step, rank, resumed):
        return loss
    where = f"at step {step} on rank {rank}"
    if fault.kind == "nan_loss":
        return loss * float("nan")
    if fault.kind == "crash":
        raise RuntimeError(f"injected crash {where}")
    if fault.kind == "oom":
        raise torch.OutOfMemoryError(f"injected out of memory {where}")
    if fault.kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.kind == "hang":
        log.warning("injected hang %s", where)
        while True:
            time.sleep(3600)
    return loss  # sigkill_in_checkpoint fires in the checkpoint's save (fault_in_checkpoint); checks/validate.py refuses other kinds


def fault_in_checkpoint(fault, step: int, rank: int, resumed: bool) -> Callable[[], None] | None:
    """faults.kind=sigkill_in_checkpoint: what kills the rank inside the save of checkpoint `step`,
    after its own files are written and before the checkpoint is complete (None: no fault)."""
    if not _due(fault, step, rank, resumed) or fault.kind != "sigkill_in_checkpoint":
        return None
    return lambda: os.kill(os.getpid(), signal.SIGKILL)
