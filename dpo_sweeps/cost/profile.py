"""The hardware a prediction runs on: a cluster profile (conf/cluster/*.yaml, typed by schema.ClusterConfig)
resolved to numbers, the measured ones of cluster=cpu included."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from dpo_sweeps.config.schema import ClusterConfig
from dpo_sweeps.errors import InvalidConfig

CLUSTER_DIR = Path(__file__).resolve().parent.parent / "conf" / "cluster"


@dataclass(frozen=True)
class DeviceProfile:
    """One device of a cluster and its links, in SI units (FLOP/s, bytes/s, seconds)."""

    name: str
    gpus_per_node: int
    memory_gib: float | None
    memory_bandwidth: float
    peak_flops: dict[str, float]  # fp32, tf32, bf16, fp16
    intra_bandwidth: float
    intra_latency: float
    inter_bandwidth: float
    inter_latency: float
    measured: bool = False  # cluster=cpu: numbers measured here, not from a datasheet
    # Measured profiles only: achieved matmul FLOP/s by precision and square size (cpu_profile.py).
    matmul_flops: tuple[tuple[str, int, float], ...] = ()
    op_overhead_s: float = 0.0  # measured profiles: the cost of one small op (dispatch), seconds
    optimizer_s_per_param: float = 0.0  # measured profiles: AdamW's step with clipping, per parameter
    optimizer_s_per_tensor: float = 0.0  # measured profiles: the same step's fixed cost per parameter tensor
    # Measured profiles: (wrapping, seconds one FSDP unit adds to a micro-batch's passes, seconds it adds to
    # the optimizer step); wrappings: cast (one rank, bf16), full_shard, shard_grad_op, no_shard (cpu_profile.py).
    fsdp_unit_s: tuple[tuple[str, float, float], ...] = ()
    # Measured profiles: taken on a busy machine (or doubted by a run), measured again at the next quiet chance.
    provisional: bool = False

    def fsdp_unit_cost(self, wrapping: str) -> tuple[float, float]:
        """(per micro-batch, per optimizer step) of one FSDP unit wrapped as `wrapping` (0, 0 unmeasured)."""
        return next(((p, s) for w, p, s in self.fsdp_unit_s if w == wrapping), (0.0, 0.0))

    def peak(self, compute: str, tf32: bool = True) -> float:
        key = "tf32" if compute == "fp32" and tf32 and "tf32" in self.peak_flops else compute
        return self.peak_flops.get(key) or self.peak_flops["fp32"]


@cache
def builtin_cluster(name: str) -> ClusterConfig:
    """conf/cluster/NAME.yaml, typed and checked (for the bench scripts, which compose no config)."""
    from omegaconf import OmegaConf

    path = CLUSTER_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CLUSTER_DIR.glob("*.yaml")))
        raise InvalidConfig("cluster", f"no profile '{name}'", known)
    cluster = ClusterConfig.of(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    cluster.check()
    return cluster


# torch.cuda.get_device_name patterns -> the built-in profile a run on that device is predicted with.
DEVICE_PROFILES = ((r"\bH200\b", "h200_sxm"), (r"\bH100\b", "h100_sxm"), (r"\bB200\b", "b200"),
                   (r"\bA100\b.*\b80\s*GB\b", "a100_80gb"), (r"\bA100\b", "a100_40gb"), (r"\bL40S\b", "l40s"))


def profile_name_of_device(device_name: str) -> str | None:
    import re

    for pattern, name in DEVICE_PROFILES:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return name
    return None
