"""Sharding with FSDP2 (`fully_shard`): one FSDP unit per transformer block, then the root.

Every strategy is `fully_shard` on a device mesh, so all of them share one code path:
- full_shard:    1-D mesh over all ranks, parameters resharded after forward (ZeRO-3);
- shard_grad_op: the same mesh, parameters kept gathered until backward (reshard_after_forward=False);
- hybrid_shard:  2-D mesh (replicate x shard), sharded within groups of `hybrid_group_size` ranks;
- no_shard:      2-D mesh (world x 1): every rank holds everything, gradients all-reduced (DDP-like).
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.models.build import check_block_name

STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def hybrid_group_size(fsdp_cfg: DictConfig, nproc_per_node: int) -> int:
    return fsdp_cfg.hybrid_group_size or nproc_per_node


def check_fsdp_config(fsdp_cfg: DictConfig, world_size: int, nproc_per_node: int, device_type: str | None) -> None:
    """`device_type`: cpu or cuda, or None where it is not known yet (resources.device=auto before the
    job is on its node: the rank checks again with the device it got)."""
    strategy = fsdp_cfg.sharding_strategy
    if strategy not in STRATEGIES:
        raise InvalidConfig("fsdp.sharding_strategy", f"unknown strategy '{strategy}'", ", ".join(STRATEGIES))
    if strategy == "hybrid_shard":
        group = hybrid_group_size(fsdp_cfg, nproc_per_node)
        if not isinstance(group, int) or group < 1 or world_size % group:
            raise InvalidConfig(
                "fsdp.hybrid_group_size", f"{group!r} does not divide the {world_size} ranks",
                "a divisor of resources.nodes * resources.nproc_per_node (null: the ranks of one node)",
            )
    if fsdp_cfg.cpu_offload and device_type == "cpu":
        raise InvalidConfig("fsdp.cpu_offload", "true on a CPU-only run (parameters are already in CPU memory)",
                            "false, or true on GPUs (resources.device=cuda, or auto where there is a GPU)")


def dtype_of(name: str, setting: str) -> torch.dtype:
    if name not in DTYPES:
        raise InvalidConfig(setting, f"unknown dtype '{name}'", ", ".join(DTYPES))
    return DTYPES[name]


def build_mesh(fsdp_cfg: DictConfig, world_size: int, nproc_per_node: int, device_type: str) -> DeviceMesh:
    strategy = fsdp_cfg.sharding_strategy
    if strategy == "hybrid_shard":
        group = hybrid_group_size(fsdp_cfg, nproc_per_node)
        return init_device_mesh(device_type, (world_size // group, group), mesh_dim_names=("replicate", "shard"))
    if strategy == "no_shard":
        return init_device_mesh(device_type, (world_size, 1), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))


def casts_dtype(mp_policy: MixedPrecisionPolicy) -> bool:
    """Whether the policy computes or reduces in a dtype other than the parameters' fp32."""
    return any(d not in (None, torch.float32) for d in (mp_policy.param_dtype, mp_policy.reduce_dtype))


def needs_fully_shard(world_size: int, mp_policy: MixedPrecisionPolicy, cpu_offload: bool) -> bool:
    """Whether a model must be wrapped by fully_shard, or may run as it is (moved to the device).

    On one rank with nothing to cast or offload, FSDP would shard over a single rank and only copy
    parameters into and out of its buffers around every forward and backward (about 6% of a step of
    the bench/dpo_vs_trl.py workload); the math is the same.
    """
    return world_size > 1 or cpu_offload or casts_dtype(mp_policy)


def shard_model(
    model: torch.nn.Module,
    *,
    fsdp_cfg: DictConfig,
    block_name: str,
    mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy,
    device: torch.device,
    trainable: bool = True,
) -> torch.nn.Module:
    """Apply fully_shard to each `block_name` module, then to the root; returns the model on `device`.

    Models are built on the CPU. fully_shard moves the shards to the mesh's device (the current CUDA
    device on GPUs, which select_device sets), except under CPU offload, where they stay in CPU memory
    and only the gathered compute copies reach the GPU. A model that needs no FSDP
    (`needs_fully_shard`) is moved to `device` here, so a one-GPU run computes on its GPU.
    """
    blocks = check_block_name(model, block_name)
    if trainable and fsdp_cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not needs_fully_shard(mesh.size(), mp_policy, bool(fsdp_cfg.cpu_offload)):
        return model.to(device)
    if mesh.device_type != device.type:
        raise ValueError(f"a {mesh.device_type} mesh cannot place a model on {device}")
    # A frozen model never runs backward: keeping its parameters gathered would only cost memory.
    reshard = bool(fsdp_cfg.reshard_after_forward) if trainable else True
    offload: OffloadPolicy = CPUOffloadPolicy() if fsdp_cfg.cpu_offload else OffloadPolicy()
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp_policy, offload_policy=offload)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp_policy, offload_policy=offload)
    return model
