"""The process group that joins a run's ranks, and the device each rank trains on.

Who this process is among the ranks (torchrun's variables, a submitit task, a local rank) is
dpo_sweeps.parallel.rank_env, which needs no torch.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

import torch
import torch.distributed as dist

from dpo_sweeps.parallel.gpu_driver import wants_cuda
from dpo_sweeps.parallel.rank_env import RankEnv


def cuda_index(local_rank: int, visible: int) -> int:
    """This rank's GPU among the `visible` ones (CUDA_VISIBLE_DEVICES applied).

    A task that sees all of its node's GPUs (torchrun, the local launcher, srun --gpus-per-node) takes
    the one of its local rank; a task bound to its own GPU(s) (srun --gpus-per-task) sees fewer than
    its local rank, and takes its local rank modulo what it sees (its first, when it sees one).
    """
    return local_rank % visible


def select_device(requested: str, local_rank: int) -> torch.device:
    """This rank's GPU when asked for (or auto and available), else cpu."""
    if wants_cuda(requested):
        if not torch.cuda.is_available():
            from dpo_sweeps.errors import InvalidConfig

            raise InvalidConfig("resources.device", "cuda requested but no GPU is visible",
                                "auto, cpu, or cuda on a GPU machine")
        device = torch.device("cuda", cuda_index(local_rank, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_process_group(env: RankEnv, device: torch.device, timeout_s: float) -> None:
    """gloo on CPU, NCCL on GPU; a dead peer surfaces as an error within `timeout_s`, never a hang."""
    os.environ.update(
        MASTER_ADDR=env.master_addr, MASTER_PORT=str(env.master_port),
        RANK=str(env.rank), WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank),
    )
    dist.init_process_group(
        # NCCL for the GPU collectives of FSDP; gloo beside it for the small CPU reductions of metrics.
        backend="cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


def all_reduce(values: list[float], op: str = "sum", device: torch.device | None = None) -> list[float]:
    """Reduce a short list of floats across ranks (sum or max), in fp64."""
    t = torch.tensor(values, dtype=torch.float64, device=device or "cpu")
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """Every rank's `rows` (a CPU tensor of the same shape on every rank), concatenated in rank order: a
    collective; over gloo also beside NCCL, the tensors being CPU ones."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return rows
    every = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(every, rows.contiguous())
    return torch.cat(every)


# Bytes of a host name in `rank_layout`'s gather (host names are at most 64 bytes on Linux).
_HOSTNAME_BYTES = 64


def rank_layout(mesh: Any, local_rank: int) -> dict[str, Any]:
    """Where every rank ran: its node (host name), local rank and coordinate in the FSDP mesh.

    A collective: every rank calls it; the tensors are CPU ones, so it goes over gloo also beside NCCL.
    """
    coordinate = mesh.get_coordinate() or []
    name = socket.gethostname().encode()[:_HOSTNAME_BYTES]
    mine = torch.zeros(_HOSTNAME_BYTES + 1 + len(coordinate), dtype=torch.int64)
    mine[:len(name)] = torch.tensor(list(name), dtype=torch.int64)
    mine[_HOSTNAME_BYTES] = local_rank
    mine[_HOSTNAME_BYTES + 1:] = torch.tensor(coordinate, dtype=torch.int64)
    rows = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        rows = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(rows, mine)
    dims = list(mesh.mesh_dim_names or [f"dim{i}" for i in range(mesh.ndim)])
    ranks = []
    for rank, row in enumerate(rows):
        host = bytes(int(b) for b in row[:_HOSTNAME_BYTES] if int(b)).decode(errors="replace")
        ranks.append({"rank": rank, "node": host, "local_rank": int(row[_HOSTNAME_BYTES]),
                      "mesh": dict(zip(dims, (int(c) for c in row[_HOSTNAME_BYTES + 1:])))})
    return {
        "mesh": dict(zip(dims, mesh.mesh.shape)),
        "nodes": list(dict.fromkeys(r["node"] for r in ranks)),
        "ranks": ranks,
    }
