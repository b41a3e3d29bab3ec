"""Who this process is among the run's ranks, and the process group that joins them.

One entry point serves three launchers: torchrun (RANK/WORLD_SIZE/MASTER_* in the environment), a
submitit job with one task per rank (SLURM or submitit's local executor), and a plain
`python -m dpo_sweeps resources.nproc_per_node=N`, which starts its own N local processes.
"""

from __future__ import annotations

import datetime
import os
import random
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dpo_sweeps.parallel.cpu_binding import OWN_CORES_ENV, rank_cores  # noqa: F401  (the rank side binds with them)


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def from_torchrun_env() -> RankEnv | None:
    """The rank torchrun (or any launcher setting the torch.distributed variables) gave us."""
    env = os.environ
    if not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} <= env.keys():
        return None
    return RankEnv(
        rank=int(env["RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        local_rank=int(env.get("LOCAL_RANK", 0)),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
        master_addr=env["MASTER_ADDR"],
        master_port=int(env["MASTER_PORT"]),
    )


def from_submitit_env() -> RankEnv | None:
    """The rank of a submitit task, when this process is one task of a multi-task job.

    The rendezvous is on the first node of the job's node list (SLURM_JOB_NODELIST), at a port drawn
    from the job id (the same on every node, another for each job of a sweep), whatever MASTER_ADDR
    or MASTER_PORT the submitting shell had: sbatch passes its environment on, submitit's `export()`
    refuses to run over a MASTER_ADDR already set, and a port inherited by every job of a sweep
    would have them all bind the same one. So the values are computed, not exported;
    `init_process_group` sets the variables for this process.
    """
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return None
    import submitit

    try:
        job_env = submitit.JobEnvironment()
    except RuntimeError:
        return None
    if job_env.num_tasks <= 1:
        return None
    return RankEnv(
        rank=job_env.global_rank,
        world_size=job_env.num_tasks,
        local_rank=job_env.local_rank,
        local_world_size=job_env.num_tasks // job_env.num_nodes,
        master_addr=job_env.hostnames[0],
        master_port=random.Random(job_env.job_id).randint(20000, 60000),
    )


def wants_cuda(requested: str) -> bool:
    """Whether `resources.device` asks for a GPU: cuda, or auto where one is visible."""
    return requested == "cuda" or (requested == "auto" and torch.cuda.is_available())


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
