"""Speed and memory, measured the same way for every strategy and precision.

Metric names are INTERFACE.md's: perf/tokens_per_s (all ranks), perf/tokens_per_s_per_device,
perf/examples_per_s (pairs/s), perf/step_time_s (median after warm-up), perf/peak_memory_gib (the
busiest device, from the trainer's creation on: GPU max allocated, or a CPU rank process's peak
resident memory), perf/mfu (GPU only; perf/mfu_reason says why it is null, mfu.py counts the FLOPs),
perf/first_step_s (this attempt's first step, every run) and perf/compile_s (train.compile: what that
first step took beyond the median timed step, the compile it paid).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from dpo_sweeps.parallel.distributed import all_reduce
from dpo_sweeps.parallel.process_memory import resident_bytes

GIB = 1024**3


def peak_resident_gib() -> float:
    """This process's peak resident set (VmHWM), in GiB."""
    return resident_bytes("VmHWM") / GIB


def reset_peak_memory(device: torch.device) -> None:
    """Count this run's peak memory from now (the runs of a probe batch share a process and free what
    they held in between, runtime/shared_ranks.py): CUDA's peak statistics, or on CPU the process's
    peak resident set (VmHWM, reset to the present resident set through /proc/self/clear_refs)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux: the peak is the process's
        pass


_trained_here = False  # whether a PerfMeter of this process timed a step


def trained_before() -> bool:
    """Whether a run already trained in this process (the later runs of a probe batch): the memory a
    training torch process gains beyond its tensors is then resident before the next run's model."""
    return _trained_here


def graphs_compiled() -> int:
    """Graphs torch.compile has captured in this process so far (0 where it was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")  # imported by any torch.compile, never by this check
    return utils.counters["stats"]["unique_graphs"] if utils is not None else 0


class PerfMeter:
    def __init__(self, device: torch.device, warmup_steps: int):
        self.device = device
        self.warmup_steps = warmup_steps
        self.step_times: list[float] = []
        self.step_tokens: list[float] = []
        self.step_pairs: list[float] = []
        self.step_flops: list[float] = []
        self._t0 = 0.0
        # Whether this attempt's first step compiled a graph (train.compile's blocks): its time is then
        # mostly the compile, which perf/compile_s reports and the timed steps leave out. Counted rather
        # than read from the config, so that a later run of a probe batch, whose blocks reuse the graphs
        # an earlier run of the process compiled, is not said to have paid a compile.
        self.first_step_compiled = False
        self._graphs_before = 0
        reset_peak_memory(device)  # created with the trainer, before it builds the data and models

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        self._sync()
        if not self.step_times:
            self._graphs_before = graphs_compiled()
        self._t0 = time.perf_counter()

    def stop(self, tokens: float, pairs: float, flops: float = 0.0) -> float:
        """End a step that processed `tokens` non-padding tokens and `pairs` pairs on this rank, with
        `flops` model FLOPs (mfu.py)."""
        global _trained_here
        self._sync()
        elapsed = time.perf_counter() - self._t0
        _trained_here = True
        if not self.step_times:
            self.first_step_compiled = graphs_compiled() > self._graphs_before
        self.step_times.append(elapsed)
        self.step_tokens.append(tokens)
        self.step_pairs.append(pairs)
        self.step_flops.append(flops)
        return elapsed

    def summary(self, *, world_size: int, peak_flops: float | None, mfu_reason: str | None = None) -> dict:
        """Metrics reduced over ranks (collective: every rank must call it). `peak_flops`: the device's
        peak FLOP/s for the run's precision, or None with `mfu_reason` saying why (mfu.py)."""
        timed = self._timed()
        times, tokens, pairs = self.step_times[timed], self.step_tokens[timed], self.step_pairs[timed]
        flops = self.step_flops[timed]
        if self.device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(self.device) / GIB
            reserved = torch.cuda.max_memory_reserved(self.device) / GIB
        else:
            allocated = reserved = peak_resident_gib()
        # Ranks wait for each other in collectives; the slowest rank's clock is the run's clock.
        n = len(times)
        first, compiled, *slowest = all_reduce([self.step_times[0] if self.step_times else 0.0,
                                                float(self.first_step_compiled), *times], "max")
        step_time = statistics.median(slowest) if slowest else None
        compile_s = None
        if compiled and step_time is not None and timed.start:  # a timed step after the compiling one
            compile_s = max(0.0, first - step_time)
        total_tokens, total_pairs, total_flops = all_reduce([sum(tokens), sum(pairs), sum(flops)], "sum")
        peak_allocated, peak_reserved = all_reduce([allocated, reserved], "max")
        wall = sum(slowest)
        tokens_per_s = total_tokens / wall if wall > 0 else None
        per_device = tokens_per_s / world_size if tokens_per_s is not None else None
        mfu = None
        if peak_flops and wall > 0:
            mfu = total_flops / wall / world_size / peak_flops
        elif mfu_reason is None:
            mfu_reason = "no timed steps"
        return {
            "perf/tokens_per_s": tokens_per_s,
            "perf/tokens_per_s_per_device": per_device,
            "perf/examples_per_s": total_pairs / wall if wall > 0 else None,
            "perf/peak_memory_gib": peak_allocated,
            "perf/peak_memory_reserved_gib": peak_reserved,
            "perf/speed_per_memory": per_device / peak_allocated if per_device and peak_allocated else None,
            "perf/step_time_s": step_time,
            "perf/first_step_s": first if self.step_times else None,
            "perf/compile_s": compile_s,
            "perf/mfu": mfu,
            "perf/mfu_reason": None if mfu is not None else mfu_reason,
            "perf/peak_flops": peak_flops,
            "perf/timed_steps": n,
        }

    def _timed(self) -> slice:
        """The steps timed: those after perf.warmup_steps; a run with no more steps than that times them
        all, but for a first step that compiled, whenever a step follows it."""
        skip = max(self.warmup_steps, 1) if self.first_step_compiled else self.warmup_steps
        if len(self.step_times) > skip:
            return slice(skip, None)
        return slice(1 if self.first_step_compiled and len(self.step_times) > 1 else 0, None)
