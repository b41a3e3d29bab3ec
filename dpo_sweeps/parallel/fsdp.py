"""Sharding with FSDP2 (`fully_shard`): one FSDP unit per transformer block, then the root.

Every strategy is `fully_shard` on the device mesh of the run's plan (plan.py says which mesh and
reshard policy each strategy resolves to), so all of them share one code path.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from dpo_sweeps.models.build import check_block_name
from dpo_sweeps.parallel.compile import compile_blocks
from dpo_sweeps.parallel.plan import ParallelPlan, check_dtype, check_fsdp_config, torch_dtype

__all__ = ["build_mesh", "casts_dtype", "check_fsdp_config", "dtype_of", "needs_fully_shard", "shard_model"]


def dtype_of(name: str, setting: str) -> torch.dtype:
    """The torch.dtype of a `precision.*` dtype name (plan.DTYPES), InvalidConfig naming `setting` if unknown."""
    return torch_dtype(check_dtype(name, setting))


def build_mesh(plan: ParallelPlan, device_type: str) -> DeviceMesh:
    return init_device_mesh(device_type, plan.mesh_shape, mesh_dim_names=plan.mesh_dim_names)


def casts_dtype(mp_policy: MixedPrecisionPolicy) -> bool:
    """Whether the policy computes or reduces in a dtype other than the parameters' fp32."""
    return any(d not in (None, torch.float32) for d in (mp_policy.param_dtype, mp_policy.reduce_dtype))


def needs_fully_shard(world_size: int, mp_policy: MixedPrecisionPolicy, cpu_offload: bool) -> bool:
    """Whether a model must be wrapped by fully_shard, or may run as it is (moved to the device).

    On one rank with nothing to cast or offload, FSDP would shard over a single rank and only copy
    parameters into and out of its buffers around every forward and backward (bench/README.md); the
    math is the same.
    """
    return world_size > 1 or cpu_offload or casts_dtype(mp_policy)


def shard_model(
    model: torch.nn.Module,
    *,
    plan: ParallelPlan,
    block_name: str,
    mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy,
    device: torch.device,
    trainable: bool = True,
    compiled: bool = False,
) -> torch.nn.Module:
    """Apply fully_shard to each `block_name` module, then to the root; returns the model on `device`.

    Models are built on the CPU. fully_shard moves the shards to the mesh's device (the current CUDA
    device on GPUs, which select_device sets), except under CPU offload, where they stay in CPU memory
    and only the gathered compute copies reach the GPU. A model that needs no FSDP
    (`needs_fully_shard`) is moved to `device` here, so a one-GPU run computes on its GPU.

    `compiled` (train.compile): each block's forward is compiled first (parallel/compile.py), wrapped or
    not; a frozen model (`trainable=False`, the reference copy) is left eager, as compile.py says why.
    """
    blocks = check_block_name(model, block_name)
    if trainable and plan.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if compiled and trainable:  # before fully_shard, as torchtitan: FSDP2's hooks stay outside the graph
        compile_blocks(blocks, device)
    if not needs_fully_shard(mesh.size(), mp_policy, plan.cpu_offload):
        return model.to(device)
    if mesh.device_type != device.type:
        raise ValueError(f"a {mesh.device_type} mesh cannot place a model on {device}")
    # A frozen model never runs backward: keeping its parameters gathered would only cost memory.
    reshard = plan.reshard_after_forward if trainable else True
    offload: OffloadPolicy = CPUOffloadPolicy() if plan.cpu_offload else OffloadPolicy()
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp_policy, offload_policy=offload)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp_policy, offload_policy=offload)
    return model
