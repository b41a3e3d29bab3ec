"""How steady is this machine's compute? The yardstick for any speed ranking measured on it.

    python bench/steadiness.py                 # 60 s: one process per core, the same matrix products
    python bench/steadiness.py --seconds 120 --window 5

One process per usable core, each pinned to its core with one thread, repeats the same fixed piece of
work (150 products of two 256 x 256 fp32 matrices) and records how long each repeat took.
No dpo-sweeps code, no communication: what varies is the machine. It prints, per core, the median of
the repeats in each `--window`-second window and the spread of those window medians (slowest over
fastest). A speed difference between two configs smaller than that spread cannot be ranked by single
runs of a few seconds each, however they are measured.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

REPEATS_PER_UNIT = 150
SIZE = 256


def _work(core: int, seconds: float, queue) -> None:
    import torch

    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    samples = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t0 = time.perf_counter()
        for _ in range(REPEATS_PER_UNIT):
            torch.mm(a, b)
        samples.append((time.monotonic() - start, time.perf_counter() - t0))
    queue.put((core, samples))


def window_medians(samples: list[tuple[float, float]], window: float) -> list[float]:
    """Median duration of the repeats that started in each full `window`-second window."""
    by_window: dict[int, list[float]] = {}
    for started, duration in samples:
        by_window.setdefault(int(started // window), []).append(duration)
    last = int(samples[-1][0] // window) if samples else 0
    return [statistics.median(v) for k, v in sorted(by_window.items()) if k < last]  # the last may be partial


def measure(seconds: float = 60.0, window: float = 5.0, cores: list[int] | None = None) -> dict:
    """Per core: the median repeat (s), the window medians, and slowest/fastest window."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_work, args=(core, seconds, queue)) for core in cores]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    report = {}
    for core in cores:
        medians = window_medians(results[core], window)
        report[core] = {"median_s": statistics.median(d for _, d in results[core]), "window_medians_s": medians,
                        "spread": max(medians) / min(medians) if medians else float("nan")}
    return report


def describe(report: dict, window: float) -> str:
    lines = []
    for core, r in report.items():
        ms = " ".join(f"{m * 1e3:.0f}" for m in r["window_medians_s"])
        lines.append(f"core {core}: median {r['median_s'] * 1e3:.1f} ms a unit; {window:g}-s window medians (ms): "
                     f"{ms}; slowest/fastest window {r['spread']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--window", type=float, default=5.0, help="seconds per window (a quickstart run trains ~5 s)")
    args = parser.parse_args()
    print(describe(measure(args.seconds, args.window), args.window))
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
