"""Which cores a CPU rank runs on. Light on purpose: the launchers bind tasks with it before any
rank process (and torch) starts."""

from __future__ import annotations

# Set (to "1") in a rank process that a launcher has bound to cores of its own.
OWN_CORES_ENV = "DPO_SWEEPS_OWN_CORES"


def rank_cores(allowed: list[int], local_rank: int, local_world_size: int) -> list[int] | None:
    """This local rank's own block of the `allowed` cores (contiguous, equal sizes), or None when there
    are fewer cores than ranks. Ranks on cores of their own are neither moved between cores nor made to
    share one (the gain is measured in bench/README.md)."""
    per_rank = len(allowed) // local_world_size
    if per_rank < 1:
        return None
    return sorted(allowed)[local_rank * per_rank:(local_rank + 1) * per_rank]
