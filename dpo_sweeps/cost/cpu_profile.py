"""cluster=cpu: this machine's profile, measured once and cached under $DPO_SWEEPS_CACHE/cluster.

A CPU has no datasheet peak a step reaches, so the profile is what a rank achieves here: matmul FLOP/s per
precision at a few square sizes on the threads one rank gets (the step predictor interpolates by the
model's hidden size), the cost of one small op with autograd (dispatch: what bounds a tiny model's step), the memory
bandwidth a rank's copy reaches, and the gloo all-gather bandwidth and latency between two local ranks.
The cache is keyed by the thread count and the torch version; delete it to measure again. Measure on a
quiet machine: on cores other processes hold, a multi-threaded small matmul waits for its slowest thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpo_sweeps.config.schema import ClusterConfig
from dpo_sweeps.cost.profile import DeviceProfile
from dpo_sweeps.rundir.atomic import write_json_atomic
from dpo_sweeps.rundir.paths import cache_root

SIZES = (64, 128, 256, 512, 1024)
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
GATHER_BYTES = 8 * 2**20


def default_threads(nproc_per_node: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, nproc_per_node))


def cache_path(threads: int) -> Path:
    import torch

    return cache_root() / "cluster" / f"cpu-{threads}threads-torch{torch.__version__}.json"


def cached_measurement(threads: int) -> dict | None:
    try:
        return json.loads(cache_path(threads).read_text())
    except (OSError, ValueError):
        return None


def measure(threads: int) -> dict:
    """The micro-benchmark (a few seconds): matmuls in this process on `threads` threads, gloo between two
    fresh processes."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        matmul = [[short, n, _matmul_flops(torch, getattr(torch, name), n)] for short, name in PRECISIONS.items()
                  for n in SIZES]
        op = _best_of(lambda: _autograd_chain(torch), 200) / (2 * CHAIN_OPS + 1)
        big = torch.empty(32 * 2**20, dtype=torch.uint8)
        copy = 2 * big.numel() / _best_of(lambda: big.clone(), 5, at_least=5)
    finally:
        torch.set_num_threads(before)
    bandwidth, latency = _gloo_all_gather()
    return {"threads": threads, "matmul_flops": matmul, "op_overhead_s": op, "memory_bandwidth": copy,
            "gloo_bandwidth": bandwidth, "gloo_latency_s": latency, "measured_at": time.time()}


def cpu_device_profile(cluster: ClusterConfig, threads: int | None = None) -> DeviceProfile:
    """The profile of cluster=cpu on `threads` threads per rank: cached, or measured now and cached."""
    threads = threads or default_threads(1)
    found = cached_measurement(threads)
    if found is None:
        found = measure(threads)
        try:
            write_json_atomic(cache_path(threads), found)
        except OSError:
            pass  # measured again next time
    return profile_of(cluster, found)


def profile_of(cluster: ClusterConfig, m: dict) -> DeviceProfile:
    matmul = tuple((c, int(n), float(f)) for c, n, f in m["matmul_flops"])
    peaks = {c: max(f for c2, _, f in matmul if c2 == c) for c in PRECISIONS}
    return DeviceProfile(
        name=cluster.name, gpus_per_node=cluster.gpus_per_node, memory_gib=cluster.device_memory_gib,
        memory_bandwidth=m["memory_bandwidth"], peak_flops=peaks, intra_bandwidth=m["gloo_bandwidth"],
        intra_latency=m["gloo_latency_s"], inter_bandwidth=m["gloo_bandwidth"], inter_latency=m["gloo_latency_s"],
        measured=True, matmul_flops=matmul, op_overhead_s=m["op_overhead_s"])


def _best_of(fn, repeats: int, budget_s: float = 1.0, at_least: int = 20) -> float:
    """The fastest of up to `repeats` calls (after one warm-up), stopping once `budget_s` is spent and
    `at_least` calls ran: the fastest is the machine's, the others waited for cores another process held."""
    fn()
    best, spent = float("inf"), 0.0
    for i in range(max(repeats, at_least)):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget_s and i + 1 >= at_least:
            break
    return best


CHAIN_OPS = 20


def _autograd_chain(torch) -> None:
    """CHAIN_OPS small elementwise ops recorded by autograd, then their backward: what one op of a tiny
    model's step costs here (dispatch, autograd, thread-pool hand-off), whatever its size."""
    x = torch.randn(64, 64, requires_grad=True)
    y = x
    for _ in range(CHAIN_OPS):
        y = y * 1.0001
    y.sum().backward()


def _matmul_flops(torch, dtype, n: int) -> float:
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    repeats = max(3, int(2e8 / n**3))
    seconds = _best_of(lambda: torch.mm(a, b), repeats)
    return 2 * n**3 / seconds


GLOO_RANK = """
import sys, time, torch, torch.distributed as dist
rank, path, nbytes = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2)
def timed(numel, repeats):
    x = torch.ones(numel // 2, dtype=torch.uint8); out = torch.empty(numel, dtype=torch.uint8)
    dist.all_gather_into_tensor(out, x); best = float("inf")
    for _ in range(repeats):
        dist.barrier(); t = time.perf_counter(); dist.all_gather_into_tensor(out, x); best = min(best, time.perf_counter() - t)
    return best
big, small = timed(nbytes, 5), timed(64, 20)
if rank == 0:
    print(big, small)
dist.destroy_process_group()
"""


def _gloo_all_gather() -> tuple[float, float]:
    """(bytes/s, seconds) of a two-rank gloo all-gather: the bus bandwidth of GATHER_BYTES, the latency of 64."""
    with tempfile.TemporaryDirectory() as tmp:
        store = str(Path(tmp) / "store")
        procs = [subprocess.Popen([sys.executable, "-c", GLOO_RANK, str(r), store, str(GATHER_BYTES)],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for r in (0, 1)]
        out = [p.communicate(timeout=120)[0] for p in procs]
    big, small = (float(x) for x in out[0].split())
    # A ring all-gather of n bytes on 2 ranks moves n/2 per rank; latency is the small message's time.
    return GATHER_BYTES / 2 / max(big - small, 1e-9), small
