"""Which CPU cores and GPUs of this machine each concurrent local job gets.

Every job gets its own set, never shared with another running job:
- a GPU job gets one GPU per rank (its own `CUDA_VISIBLE_DEVICES`) and the CPU cores that go
  with those GPUs (the machine's cores split evenly between its GPUs);
- a CPU job gets `cpus_per_rank` cores per rank. A job that needs more cores than the machine
  has runs alone, on all of them.
The job process applies its placement before anything touches CUDA (`Placement.apply`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from dpo_sweeps.parallel.cpu_binding import OWN_CORES_ENV, rank_cores
from dpo_sweeps.parallel.gpu_driver import gpu_driver_present


@dataclass(frozen=True)
class Placement:
    cpus: tuple[int, ...]
    # CUDA_VISIBLE_DEVICES entries (indices or UUIDs); empty for a CPU job.
    gpus: tuple[str, ...] = ()

    def apply(self, task: int = 0, tasks: int = 1, bind_cores: bool = False) -> None:
        """Pin this process (task `task` of the job's `tasks`) to the placement.

        With `bind_cores`, a CPU job's task (one rank) takes its own block of the job's cores
        (`resources.bind_cores`), and says so to the trainer, which then uses that many threads.
        """
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        if not self.cpus or not hasattr(os, "sched_setaffinity"):
            return
        own = rank_cores(list(self.cpus), task, tasks) if bind_cores and tasks > 1 and not self.gpus else None
        os.sched_setaffinity(0, own or self.cpus)
        if own:
            os.environ[OWN_CORES_ENV] = "1"

    def describe(self) -> str:
        where = f"GPUs {','.join(self.gpus)}" if self.gpus else "CPU"
        return f"{where}, cores {_ranges(self.cpus)}" if self.cpus else where


def _ranges(cpus: tuple[int, ...]) -> str:
    parts, start, prev = [], None, None
    for c in sorted(cpus):
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = c
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(parts)


def usable_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else every GPU torch sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    if not gpu_driver_present():  # no GPU to count: say so without loading torch
        return []
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no CUDA build, no driver: a CPU machine
        return []


@dataclass
class DevicePool:
    """The cores and GPUs local jobs are placed on; `take` and `give_back` as jobs start and end."""

    cpus: list[int]
    gpus: list[str]
    cpus_per_rank: int = 1
    free_cpus: set[int] = field(init=False)
    free_gpus: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.free_cpus = set(self.cpus)
        self.free_gpus = list(self.gpus)

    def gpu_cores(self, gpu: str) -> tuple[int, ...]:
        """The cores that go with one GPU: an even share of the machine's cores."""
        share = len(self.cpus) // len(self.gpus) if self.gpus else 0
        if share == 0:
            return ()
        i = self.gpus.index(gpu)
        return tuple(self.cpus[i * share:(i + 1) * share])

    def cannot_hold(self, ranks: int, use_gpus: bool) -> str | None:
        """Why a job of `ranks` ranks can never run here, or None."""
        if use_gpus and ranks > len(self.gpus):
            return (f"needs {ranks} GPUs (one per rank) but this machine has {len(self.gpus)} visible; "
                    f"lower resources.nodes x resources.nproc_per_node, or use hydra/launcher=slurm")
        return None

    def slots(self, ranks: int, use_gpus: bool) -> int:
        """How many jobs of `ranks` ranks the whole machine runs at once (at least 1)."""
        if use_gpus:
            return max(1, len(self.gpus) // ranks)
        return max(1, len(self.cpus) // (ranks * self.cpus_per_rank))

    def take(self, ranks: int, use_gpus: bool) -> Placement | None:
        """A placement for the job if it fits now (taking it from the pool), else None."""
        if use_gpus:
            if ranks > len(self.free_gpus):
                return None
            gpus = tuple(self.free_gpus[:ranks])
            del self.free_gpus[:ranks]
            cores = tuple(c for g in gpus for c in self.gpu_cores(g) if c in self.free_cpus)
            self.free_cpus -= set(cores)
            return Placement(cpus=cores, gpus=gpus)
        need = ranks * self.cpus_per_rank
        if need > len(self.cpus):
            if len(self.free_cpus) < len(self.cpus) or len(self.free_gpus) < len(self.gpus):
                return None  # too big for the machine: it waits until it can run alone
            need = len(self.cpus)
        if need > len(self.free_cpus):
            return None
        cores = tuple(sorted(self.free_cpus)[:need])
        self.free_cpus -= set(cores)
        return Placement(cpus=cores)

    def give_back(self, placement: Placement) -> None:
        self.free_cpus |= set(placement.cpus)
        self.free_gpus.extend(g for g in placement.gpus if g not in self.free_gpus)
        self.free_gpus.sort(key=self.gpus.index)
