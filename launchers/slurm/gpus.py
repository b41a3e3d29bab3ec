"""Whether a SLURM partition has GPUs, for runs with `resources.device=auto`.

auto means "cuda where there is a GPU"; on SLURM the job's node only shows the GPUs the job asked
for, so the launcher must decide before submitting: it asks for one GPU per rank when the partition's
nodes have GPUs (sinfo's generic resources, GRES), and for none on a CPU-only partition.
"""

from __future__ import annotations

import re
import subprocess

from dpo_sweeps.errors import InvalidConfig

# One `gpu[:type]:count` entry of a GRES list, e.g. gpu:8, gpu:h100:8(S:0-1), gpu:a100:4,tmpfs:100G.
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,()]+)?:(\d+)")


def gpus_in_gres(gres: str) -> int:
    """GPUs per node in a GRES string as sinfo's %G prints it ('(null)' for none)."""
    return sum(int(m.group(1)) for m in _GPU_GRES.finditer(gres.strip()))


def partition_gpus(sinfo_lines: list[str], partition: str | None) -> int:
    """The most GPUs a node of `partition` has (None: the default partition, marked '*'), from
    `sinfo -h -o '%P|%G'` lines; SLURM places a job asking for GPUs only on nodes that have them."""
    found = None
    for line in sinfo_lines:
        name, _, gres = line.strip().partition("|")
        default = name.endswith("*")
        if (partition is None and default) or name.rstrip("*") == partition:
            found = max(found or 0, gpus_in_gres(gres))
    if found is None:
        where = f"partition '{partition}'" if partition else "a default partition"
        raise InvalidConfig("hydra.launcher.partition", f"sinfo lists no {where}",
                            "a partition sinfo lists (or resources.device=cuda|cpu)")
    return found


def query_partition_gpus(partition: str | None, env: dict[str, str] | None = None) -> int:
    """Ask the cluster (sinfo) how many GPUs a node of `partition` has."""
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%P|%G"], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = f"cannot ask SLURM whether the partition has GPUs (sinfo: {exc})"
    else:
        if proc.returncode == 0:
            return partition_gpus(proc.stdout.splitlines(), partition)
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        problem = f"cannot ask SLURM whether the partition has GPUs (sinfo: {lines[-1] if lines else proc.returncode})"
    raise InvalidConfig("resources.device", f"auto {problem}", "cuda or cpu, which need no answer from the cluster")
