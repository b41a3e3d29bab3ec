"""Whether this machine can show a process any GPU at all, answered without loading torch.

A sweep's own process composes and checks every point before launch and never trains; on a CPU
machine it has no other reason to import torch (about a second) than asking torch for GPUs.
"""

from __future__ import annotations

import os


def gpu_driver_present() -> bool:
    """An NVIDIA driver (/proc/driver/nvidia/gpus) or ROCm's (/dev/kfd) is loaded: only then can torch
    see a GPU (then ask torch how many)."""
    return os.path.isdir("/proc/driver/nvidia/gpus") or os.path.exists("/dev/kfd")
