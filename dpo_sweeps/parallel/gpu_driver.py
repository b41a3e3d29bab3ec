"""Whether this machine can show a process any GPU at all, answered without loading torch.

A sweep's own process composes and checks every point before launch and never trains, and the process
that starts a run's local ranks only supervises them; on a CPU machine neither has another reason to
import torch (seconds) than asking torch for GPUs.
"""

from __future__ import annotations

import os


def gpu_driver_present() -> bool:
    """An NVIDIA driver (/proc/driver/nvidia/gpus) or ROCm's (/dev/kfd) is loaded: only then can torch
    see a GPU (then ask torch how many)."""
    return os.path.isdir("/proc/driver/nvidia/gpus") or os.path.exists("/dev/kfd")


def wants_cuda(requested: str) -> bool:
    """Whether `resources.device` asks for a GPU: cuda, or auto where torch sees one (asked only where a
    driver is loaded: torch sees no GPU without one)."""
    if requested == "cuda":
        return True
    if requested != "auto" or not gpu_driver_present():
        return False
    import torch

    return torch.cuda.is_available()
