"""This process's own memory as the kernel counts it: its resident set now or at its peak, and the heap
glibc holds free handed back. Standard library only: the sweep's process asks it too (parallel/fit.py)."""

from __future__ import annotations

import ctypes


def resident_bytes(field: str = "VmRSS") -> int:
    """This process's resident set from /proc/self/status: now (VmRSS) or at its peak (VmHWM); 0 if unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def release_freed_heap() -> None:
    """Hand the memory the process's malloc holds free back to the system (tcmalloc's
    MallocExtension_ReleaseFreeMemory when it is preloaded, glibc's malloc_trim(3)), so that the
    process's resident memory counts only what it holds: read before a model is built, it is the
    baseline the memory estimate's `heap_kept` assumes, also in a process that trained before (a
    probe batch). No-op where neither is found."""
    try:
        process = ctypes.CDLL(None)  # the symbols the process has loaded, a preloaded malloc's among them
        if (release := getattr(process, "MallocExtension_ReleaseFreeMemory", None)) is not None:
            release()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
