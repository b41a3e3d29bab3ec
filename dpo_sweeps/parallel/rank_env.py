"""Who this process is among the run's ranks, without importing torch.

One entry point serves three launchers: torchrun (RANK/WORLD_SIZE/MASTER_* in the environment), a
submitit job with one task per rank (SLURM or submitit's local executor), and a plain
`python -m dpo_sweeps resources.nproc_per_node=N`, which starts its own N local processes. The process
that starts N local ranks only supervises them, so it reads this module and never imports the training
stack; the process group that joins the ranks is dpo_sweeps.parallel.distributed.
"""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass


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
