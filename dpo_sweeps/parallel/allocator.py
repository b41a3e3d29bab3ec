"""The memory allocator of the processes that train on CPU memory (`resources.cpu_allocator`).

glibc's malloc, the default, serves a training step's large buffers from its heap once its dynamic mmap
threshold has risen (mallopt(3)), and keeps the holes they leave when later tensors land between them:
on two fp32 CPU ranks most of a rank's resident set can be such free memory, and where the first step
happens to place its buffers moves a rank's peak from run to run (bench/README.md). tcmalloc
(gperftools) serves large buffers from spans it coalesces again when they are freed: less memory held,
the same run after run, and faster steps. PyTorch's own CPU launcher (torch.backends.xeon.run_cpu)
preloads it for the same reasons.

An allocator is chosen when a process starts (LD_PRELOAD): dpo-sweeps puts it in the environment of the
rank processes it starts (runtime/local_ranks.py; a one-rank run then trains in a process of its own),
and of the tasks of a SLURM job or a local launcher's job (launchers/slurm/launcher.py,
launchers/local.py). A rank someone else started (torchrun) must have been started with an allocator
named outright, or the run fails before it trains
(train/lifecycle.py). The memory estimate counts the allocator the rank runs with (`allocator_in_use`),
before launch the one `chosen_allocator` picks on the machine that launches, parallel/memory_estimate.py.

`auto`, the default, picks tcmalloc for runs of several ranks that train on CPU where its library is
installed: that is where the allocator decides a rank's peak (a GPU's memory is the caching allocator's),
and those ranks are processes started for the run anyway. A one-rank run trains in the process it was
started in, with that process's malloc (no second process to start), and a machine without the library
still runs, with glibc.

Imports no torch: the sweep's process checks the library before launch (checks/validate.py).
"""

from __future__ import annotations

import ctypes.util
import functools
import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

from dpo_sweeps.config.schema import CPU_ALLOCATORS
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.parallel.gpu_driver import wants_cuda

AUTO, GLIBC, TCMALLOC = CPU_ALLOCATORS
# The shared libraries that provide an allocator, by the names ctypes.util.find_library takes, in order of
# preference: gperftools' minimal build (no heap profiler: Debian and Ubuntu's libtcmalloc-minimal4) first.
LIBRARIES = {TCMALLOC: ("tcmalloc_minimal", "tcmalloc")}
INSTALL = {TCMALLOC: "gperftools' tcmalloc (Debian/Ubuntu: apt install libtcmalloc-minimal4; conda: gperftools)"}


# find_library runs ldconfig: once per library and process, not once per point of a large grid
_find_library = functools.cache(ctypes.util.find_library)


def allocator_library(name: str) -> str | None:
    """The shared library that provides allocator `name` on this machine (a name the dynamic loader
    finds, e.g. libtcmalloc_minimal.so.4); None for glibc, which every process has, or when none is found."""
    for library in LIBRARIES.get(name, ()):
        if found := _find_library(library):
            return found
    return None


def chosen_allocator(requested: str, on_gpu: bool, world_size: int) -> str:
    """The allocator ranks start with for `resources.cpu_allocator=requested`: the one named, or for auto
    tcmalloc where several ranks train on CPU (not `on_gpu`) and its library is found on this machine,
    else glibc."""
    if requested != AUTO:
        return requested
    return TCMALLOC if world_size > 1 and not on_gpu and allocator_library(TCMALLOC) else GLIBC


def run_allocator(resources) -> str:
    """chosen_allocator for a run's `resources` section, its device decided on this machine (gpu_driver.py)."""
    return chosen_allocator(resources.cpu_allocator, wants_cuda(resources.device), resources.world_size)


def missing_allocator(name: str) -> str | None:
    """Why allocator `name` cannot run here (one clause), or None when it can (auto always can)."""
    if name in (AUTO, GLIBC) or allocator_library(name):
        return None
    names = " or ".join(f"lib{library}" for library in LIBRARIES[name])
    return f"no {names} on this machine; install {INSTALL[name]}"


def allocator_in_use() -> str:
    """The allocator this process runs with: tcmalloc when its library is mapped into the process."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return GLIBC
    return next((name for name, libraries in LIBRARIES.items()
                 if any(f"/lib{library}.so" in maps for library in libraries)), GLIBC)


def check_allocator_in_use(name: str) -> None:
    """Refuse to train with another malloc than `name` (a rank torchrun or srun started without it); auto
    takes the one the rank has, and summary.json says which."""
    if name not in (AUTO, GLIBC) and (in_use := allocator_in_use()) != name:
        raise InvalidConfig("resources.cpu_allocator", f"{name}, but this rank runs with {in_use}'s malloc "
                            "(a rank torchrun or srun starts is not started by dpo-sweeps)",
                            f"auto, glibc, or LD_PRELOAD={allocator_library(name)} in the rank's environment")


def preloaded(name: str, env: MutableMapping[str, str]) -> None:
    """Put allocator `name` in `env`'s LD_PRELOAD, ahead of what it preloads already (glibc: nothing)."""
    library = allocator_library(name)
    if library is None:
        return
    kept = [entry for entry in env.get("LD_PRELOAD", "").split(":") if entry and entry != library]
    env["LD_PRELOAD"] = ":".join([library, *kept])


def preload_line(name: str) -> str | None:
    """The shell line a job script runs before it starts its tasks so that they start with allocator
    `name` (what they preload already kept after it); None for glibc. The SLURM and local launchers'."""
    library = allocator_library(name)
    return None if library is None else f"export LD_PRELOAD={library}${{LD_PRELOAD:+:$LD_PRELOAD}}"


@contextmanager
def starting_processes_with(name: str) -> Iterator[None]:
    """This process's environment preloads allocator `name` while it starts processes (multiprocessing's
    spawn passes the environment on as it is), and is given back after."""
    before = os.environ.get("LD_PRELOAD")
    preloaded(name, os.environ)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = before
