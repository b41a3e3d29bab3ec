"""Speed and memory, measured the same way for every strategy and precision.

Metric names are INTERFACE.md's: perf/tokens_per_s (all ranks), perf/tokens_per_s_per_device,
perf/examples_per_s (pairs/s), perf/step_time_s (median after warm-up), perf/peak_memory_gib (the
busiest device, from the trainer's creation on: GPU max allocated, or a CPU rank process's peak
resident memory), perf/mfu (GPU only; perf/mfu_reason says why it is null, mfu.py counts the FLOPs).
"""

from __future__ import annotations

import statistics
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


class PerfMeter:
    def __init__(self, device: torch.device, warmup_steps: int):
        self.device = device
        self.warmup_steps = warmup_steps
        self.step_times: list[float] = []
        self.step_tokens: list[float] = []
        self.step_pairs: list[float] = []
        self.step_flops: list[float] = []
        self._t0 = 0.0
        reset_peak_memory(device)  # created with the trainer, before it builds the data and models

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def stop(self, tokens: float, pairs: float, flops: float = 0.0) -> float:
        """End a step that processed `tokens` non-padding tokens and `pairs` pairs on this rank, with
        `flops` model FLOPs (mfu.py)."""
        global _trained_here
        self._sync()
        elapsed = time.perf_counter() - self._t0
        _trained_here = True
        self.step_times.append(elapsed)
        self.step_tokens.append(tokens)
        self.step_pairs.append(pairs)
        self.step_flops.append(flops)
        return elapsed

    def summary(self, *, world_size: int, peak_flops: float | None, mfu_reason: str | None = None) -> dict:
        """Metrics reduced over ranks (collective: every rank must call it). `peak_flops`: the device's
        peak FLOP/s for the run's precision, or None with `mfu_reason` saying why (mfu.py)."""
        timed = slice(self.warmup_steps, None) if len(self.step_times) > self.warmup_steps else slice(0, None)
        times, tokens, pairs = self.step_times[timed], self.step_tokens[timed], self.step_pairs[timed]
        flops = self.step_flops[timed]
        if self.device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(self.device) / GIB
            reserved = torch.cuda.max_memory_reserved(self.device) / GIB
        else:
            allocated = reserved = peak_resident_gib()
        # Ranks wait for each other in collectives; the slowest rank's clock is the run's clock.
        n = len(times)
        slowest = all_reduce(times or [0.0], "max") if n else []
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
            "perf/step_time_s": statistics.median(slowest) if slowest else None,
            "perf/mfu": mfu,
            "perf/mfu_reason": None if mfu is not None else mfu_reason,
            "perf/peak_flops": peak_flops,
            "perf/timed_steps": n,
        }
