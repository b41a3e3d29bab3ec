"""Speed and memory, measured the same way for every strategy and precision.

Metric names are INTERFACE.md's: perf/tokens_per_s (all ranks), perf/tokens_per_s_per_device,
perf/examples_per_s (pairs/s), perf/step_time_s (median after warm-up), perf/peak_memory_gib (the
busiest device: GPU max allocated, or a CPU rank process's peak resident memory), perf/mfu (GPU only).
"""

from __future__ import annotations

import statistics
import time

import torch

from dpo_sweeps.distributed import all_reduce

GIB = 1024**3

# Dense peak FLOP/s per device by (name fragment, dtype) for MFU; fp32 uses TF32 tensor cores.
PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 494e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 156e12},
    "L40S": {"bf16": 362e12, "fp16": 362e12, "fp32": 183e12},
    "A10": {"bf16": 125e12, "fp16": 125e12, "fp32": 62.5e12},
}


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


def peak_resident_gib() -> float:
    """This process's peak resident set (VmHWM), in GiB."""
    return resident_bytes("VmHWM") / GIB


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, by_dtype in PEAK_FLOPS.items():
        if fragment in name:
            return by_dtype.get(precision)
    return None


def flops_per_token(num_params: int, with_reference: bool) -> float:
    """6N for the policy's forward and backward, 2N more for the reference forward (Kaplan et al. 2020)."""
    return (6 + (2 if with_reference else 0)) * num_params


class PerfMeter:
    def __init__(self, device: torch.device, warmup_steps: int):
        self.device = device
        self.warmup_steps = warmup_steps
        self.step_times: list[float] = []
        self.step_tokens: list[float] = []
        self.step_pairs: list[float] = []
        self._t0 = 0.0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def stop(self, tokens: float, pairs: float) -> float:
        """End a step that processed `tokens` non-padding tokens and `pairs` pairs on this rank."""
        self._sync()
        elapsed = time.perf_counter() - self._t0
        self.step_times.append(elapsed)
        self.step_tokens.append(tokens)
        self.step_pairs.append(pairs)
        return elapsed

    def summary(self, *, world_size: int, flops_per_token: float, peak_flops: float | None) -> dict:
        """Metrics reduced over ranks (collective: every rank must call it)."""
        timed = slice(self.warmup_steps, None) if len(self.step_times) > self.warmup_steps else slice(0, None)
        times, tokens, pairs = self.step_times[timed], self.step_tokens[timed], self.step_pairs[timed]
        if self.device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(self.device) / GIB
            reserved = torch.cuda.max_memory_reserved(self.device) / GIB
        else:
            allocated = reserved = peak_resident_gib()
        # Ranks wait for each other in collectives; the slowest rank's clock is the run's clock.
        n = len(times)
        slowest = all_reduce(times or [0.0], "max") if n else []
        total_tokens, total_pairs = all_reduce([sum(tokens), sum(pairs)], "sum")
        peak_allocated, peak_reserved = all_reduce([allocated, reserved], "max")
        wall = sum(slowest)
        tokens_per_s = total_tokens / wall if wall > 0 else None
        per_device = tokens_per_s / world_size if tokens_per_s is not None else None
        mfu = None
        if peak_flops and per_device is not None:
            mfu = per_device * flops_per_token / peak_flops
        return {
            "perf/tokens_per_s": tokens_per_s,
            "perf/tokens_per_s_per_device": per_device,
            "perf/examples_per_s": total_pairs / wall if wall > 0 else None,
            "perf/peak_memory_gib": peak_allocated,
            "perf/peak_memory_reserved_gib": peak_reserved,
            "perf/speed_per_memory": per_device / peak_allocated if per_device and peak_allocated else None,
            "perf/step_time_s": statistics.median(slowest) if slowest else None,
            "perf/mfu": mfu,
            "perf/timed_steps": n,
        }
