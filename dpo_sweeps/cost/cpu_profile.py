"""cluster=cpu: this machine's profile, measured once and cached under $DPO_SWEEPS_CACHE/cluster.

A CPU has no datasheet peak a step reaches, so the profile is what a rank achieves here. The model's own
passes are timed per point at its shapes (cpu_passes.py); this profile holds what they do not:
- matmul FLOP/s per precision at a few square sizes on the threads one rank gets, the cost of one small
  op with autograd (dispatch) and the bandwidth of a copy (the memory-bound work: casts, QLoRA's unpacking);
- the optimizer: AdamW's step with gradient clipping, per parameter (large tensors) and per tensor (its
  per-tensor loops, which a small model's step is mostly made of), on plain tensors;
- what FSDP2 adds to a step, per unit (block), for each way a run wraps its model: a small model of
  UNIT_TENSORS-tensor units is trained with and without `fully_shard` in fresh gloo processes (one rank that
  casts to bf16, as a one-rank bf16 run does; two ranks full_shard, shard_grad_op and no_shard), and the
  difference per unit, forward and backward and in the optimizer, is the hooks', copies' and collectives'
  fixed cost; the gloo all-gather's bandwidth between two local ranks adds the cost of the bytes.
The cache is keyed by the thread count and the torch version; delete it to measure again. On cores other
processes hold, a multi-threaded small matmul waits for its slowest thread: the measurement records the
load it was taken under (load.py), and one taken on a busy machine is provisional, measured again at the
next quiet chance (or once a run disagreed with a forecast made from it: `mark_for_remeasuring`).
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
from dpo_sweeps.cost.load import Load, LoadWatch, busy_now
from dpo_sweeps.cost.profile import DeviceProfile
from dpo_sweeps.rundir.atomic import write_json_atomic
from dpo_sweeps.rundir.paths import cache_root

SIZES = (64, 128, 256, 512, 1024)
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
GATHER_BYTES = 8 * 2**20
VERSION = 3  # of what a measurement holds (3: the optimizer's cost per tensor): an older cache is measured again


def default_threads(nproc_per_node: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, nproc_per_node))


def cache_path(threads: int) -> Path:
    import torch

    return cache_root() / "cluster" / f"cpu-v{VERSION}-{threads}threads-torch{torch.__version__}.json"


def maybe_measured(threads: int) -> bool:
    """Whether a measurement on `threads` threads may be cached, for some torch version; read without
    importing torch (a second or more), so that what has none finds out at once."""
    return any((cache_root() / "cluster").glob(f"cpu-v{VERSION}-{threads}threads-torch*.json"))


def cached_measurement(threads: int) -> dict | None:
    try:
        return json.loads(cache_path(threads).read_text())
    except (OSError, ValueError):
        return None


def measure(threads: int) -> dict:
    """The micro-benchmark (a few seconds): matmuls in this process on `threads` threads, gloo between two
    fresh processes; with the load it was taken under."""
    with LoadWatch() as watch:
        found = _measure(threads)
    return {**found, "load": watch.load().as_dict()}


def provisional(m: dict) -> bool:
    """A measurement taken on a busy machine (or of unknown load), or doubted by a run."""
    load = Load.of(m.get("load"))
    return load is None or not load.quiet or bool(m.get("retime"))


def mark_for_remeasuring(threads: int) -> bool:
    """Mark the cached profile on `threads` threads to be measured again at the next quiet chance; whether it
    is so marked."""
    found = cached_measurement(threads)
    if found is None:
        return False
    if found.get("retime"):
        return True
    try:
        write_json_atomic(cache_path(threads), {**found, "retime": True})
    except OSError:
        return False
    return True


def _measure(threads: int) -> dict:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        matmul = [[short, n, _matmul_flops(torch, getattr(torch, name), n)] for short, name in PRECISIONS.items()
                  for n in SIZES]
        op = _best_of(lambda: _autograd_chain(torch), 200) / (2 * CHAIN_OPS + 1)
        big = torch.empty(32 * 2**20, dtype=torch.uint8)
        copy = 2 * big.numel() / _best_of(lambda: big.clone(), 5, at_least=5)
        optimizer = _optimizer_seconds_per_param(torch)
        per_tensor = _optimizer_seconds_per_tensor(torch)
    finally:
        torch.set_num_threads(before)
    bandwidth, latency = _gloo_all_gather()
    return {"threads": threads, "matmul_flops": matmul, "op_overhead_s": op, "memory_bandwidth": copy,
            "optimizer_s_per_param": optimizer, "optimizer_s_per_tensor": per_tensor,
            "gloo_bandwidth": bandwidth, "gloo_latency_s": latency, "fsdp_unit_s": _fsdp_unit_costs(),
            "measured_at": time.time()}


def cpu_device_profile(cluster: ClusterConfig, threads: int | None = None) -> DeviceProfile:
    """The profile of cluster=cpu on `threads` threads per rank: cached, or measured now and cached."""
    threads = threads or default_threads(1)
    found = cached_measurement(threads)
    if found is None or (provisional(found) and busy_now().quiet):
        new = measure(threads)
        if found is None or not provisional(new):
            found = new
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
        measured=True, matmul_flops=matmul, op_overhead_s=m["op_overhead_s"],
        optimizer_s_per_param=m["optimizer_s_per_param"], optimizer_s_per_tensor=m["optimizer_s_per_tensor"],
        fsdp_unit_s=tuple((mode, pass_s, step_s) for mode, (pass_s, step_s) in sorted(m["fsdp_unit_s"].items())),
        provisional=provisional(m))


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
    seconds = _best_of(lambda: torch.mm(a, b), repeats, at_least=3)
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


def _optimizer_step_seconds(torch, params, grad_of, repeats: int, budget_s: float, at_least: int) -> float:
    """The fastest AdamW step over `params` with gradient-norm clipping and zeroing, as a run's optimizer
    step does, each parameter's gradient set to `grad_of(p)` first."""
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def step() -> None:
        for p in params:
            p.grad = grad_of(p)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _best_of(step, repeats, budget_s=budget_s, at_least=at_least)


def _optimizer_seconds_per_param(torch) -> float:
    """The optimizer step per parameter (OPTIMIZER_PARAMS of them in a few large tensors: the cost per
    tensor is `_optimizer_seconds_per_tensor`'s, and FSDP's per unit below)."""
    params = [torch.nn.Parameter(torch.randn(OPTIMIZER_PARAMS // 4)) for _ in range(4)]
    return _optimizer_step_seconds(torch, params, torch.ones_like, 5, budget_s=2.0, at_least=3) / OPTIMIZER_PARAMS


OPTIMIZER_PARAMS = 8 * 2**20


def _optimizer_seconds_per_tensor(torch) -> float:
    """The same step's cost per parameter tensor: its slope over OPTIMIZER_TENSORS tensors too small for
    their elements to count (torch's CPU AdamW and clipping loop over tensors, a few ops each)."""

    def seconds(n: int) -> float:
        params = [torch.nn.Parameter(torch.randn(16)) for _ in range(n)]
        grads = {p: torch.ones_like(p) for p in params}  # made once: the elements' work is not what is timed
        return _optimizer_step_seconds(torch, params, grads.__getitem__, 20, budget_s=0.5, at_least=10)

    few, many = OPTIMIZER_TENSORS
    return max(0.0, (seconds(many) - seconds(few)) / (many - few))


OPTIMIZER_TENSORS = (8, 64)
# The synthetic FSDP model: units of UNIT_TENSORS tensors (a Llama block's: 7 projections, 2 norms) of
# width UNIT_WIDTH, small enough that their bytes cost nothing next to the fixed cost measured.
UNIT_TENSORS = 9
UNIT_WIDTH = 32
FSDP_UNITS = (2, 10)
FSDP_RANK = """
import json, sys, time, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
rank, world, path, modes = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
W, TENSORS, UNITS = int(sys.argv[5]), int(sys.argv[6]), [int(u) for u in sys.argv[7].split(",")]
torch.set_num_threads(1)
dist.init_process_group("gloo", store=dist.FileStore(path, world), rank=rank, world_size=world)
def unit():
    projections = [torch.nn.Linear(W, W, bias=False) for _ in range(TENSORS - 2)]
    layers = [torch.nn.RMSNorm(W), *projections, torch.nn.RMSNorm(W)]
    return torch.nn.Sequential(*layers)
def best(fn, n=25):
    fn(); out = float("inf")
    for _ in range(n):
        dist.barrier(); t = time.perf_counter(); fn(); out = min(out, time.perf_counter() - t)
    return out
def timed(mode, units):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[unit() for _ in range(units)])
    if mode != "plain":
        shape, names = ((world, 1), ("replicate", "shard")) if mode == "no_shard" else ((world,), ("shard",))
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mode == "cast" \
            else MixedPrecisionPolicy()
        reshard = mode != "shard_grad_op"
        for block in model:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(4, W)
    def passes():
        model(x).float().sum().backward()
    def step():
        passes()
        params = [p for p in model.parameters() if p.grad is not None]
        total = torch.nn.utils.clip_grad_norm_(params, 1.0)
        float(total.full_tensor() if hasattr(total, "full_tensor") else total)
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
    t_pass = best(passes); optimizer.zero_grad(set_to_none=True)
    return t_pass, best(step) - t_pass
out = {m: {u: timed(m, u) for u in UNITS} for m in ["plain"] + modes}
if rank == 0:
    print(json.dumps(out))
dist.destroy_process_group()
"""


def _fsdp_unit_costs() -> dict[str, tuple[float, float]]:
    """Per FSDP wrapping (cast: one rank in bf16; full_shard, shard_grad_op, no_shard: two ranks), what one
    unit adds to a micro-batch's forward and backward and to the optimizer step, in seconds: the slope
    over FSDP_UNITS units of the wrapped model's time less the plain model's."""
    costs = {}
    for world, modes in ((1, ("cast",)), (2, ("full_shard", "shard_grad_op", "no_shard"))):
        with tempfile.TemporaryDirectory() as tmp:
            store = str(Path(tmp) / "store")
            args = [store, ",".join(modes), str(UNIT_WIDTH), str(UNIT_TENSORS), ",".join(map(str, FSDP_UNITS))]
            procs = [subprocess.Popen([sys.executable, "-c", FSDP_RANK, str(r), str(world), *args],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                     for r in range(world)]
            out = [p.communicate(timeout=300)[0] for p in procs]
        times = json.loads(out[0])
        few, many = (str(u) for u in FSDP_UNITS)
        for mode in modes:
            costs[mode] = tuple(
                max(0.0, ((times[mode][many][i] - times["plain"][many][i])
                          - (times[mode][few][i] - times["plain"][few][i])) / (FSDP_UNITS[1] - FSDP_UNITS[0]))
                for i in (0, 1))
    return costs
