"""Several runs in turn in one set of rank processes: how a sweep's probes share their start-up.

A probe (`probe.steps`) trains a few steps; started on its own it spends longer starting (Python and
imports in every rank, the process group, data and tokenization, the first model build) than it
measures. So the launchers run the probes of a sweep that need the same ranks as one job
(`launchers.jobs.probe_batches`), and every rank process of that job runs them one after another,
each as the Hydra job it would be alone: its own run directory, summary.json and metrics. Within
`sharing_ranks()`:
- the process group stays up from one run to the next (`train.lifecycle.run_rank` joins it once);
- the tokenized data of the previous run is reused when the next run's data settings are the same
  (`train.setup.build_data`);
- each run's peak memory is its own: what the previous run held is freed (`free_previous_run`)
  before the next trainer resets the peak (`train.perf.reset_peak_memory`).
After each run the ranks agree whether every one of them completed it (`all_completed`); if not,
they stop, and the launcher gives the runs not yet run a new set of processes.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from dpo_sweeps.parallel.distributed import all_reduce
from dpo_sweeps.parallel.process_memory import release_freed_heap

_sharing = False


@contextmanager
def sharing_ranks() -> Iterator[None]:
    """Keep the process group up between the runs of this block; leave it at the end."""
    global _sharing
    _sharing = True
    gc.freeze()  # the imported modules outlive every run: the cleanups between runs need not scan them
    try:
        yield
    finally:
        _sharing = False
        if dist.is_initialized():
            dist.destroy_process_group()


def sharing() -> bool:
    """Whether this process runs several runs in turn (inside `sharing_ranks()`)."""
    return _sharing


def all_completed(completed: bool) -> bool:
    """Whether every rank completed the run just ended (collective over the ranks that did).

    A rank whose run failed never calls it: it leaves at once, so a peer still waiting in one of
    that run's collectives sees it gone rather than a mismatched reduction. False when a peer is gone.
    """
    if not completed:
        return False
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return True
    try:
        return all_reduce([1.0], "sum")[0] == dist.get_world_size()
    except Exception:  # a peer left (its run failed) or the group broke: stop here
        return False


def free_previous_run() -> None:
    """Give back what the run just ended held: its models and optimizer (collected: FSDP modules hold
    reference cycles), the heap glibc keeps for freed small blocks, CUDA's cached blocks. What is left
    (the modules the run imported) outlives every run: frozen, the next collections skip it."""
    gc.collect()
    gc.freeze()  # after the collection: only what is alive is frozen
    release_freed_heap()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
