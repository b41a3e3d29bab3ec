"""The parallel plan: how a run is laid out on its ranks, resolved once from fsdp + precision + resources.

`resolve_plan` is the one place that interprets `fsdp.sharding_strategy`, `fsdp.reshard_after_forward`,
`fsdp.hybrid_group_size` and the `precision.*` dtypes. Everything downstream reads the resulting
`ParallelPlan`: the device mesh and `fully_shard` (fsdp.py), the mixed-precision policy and the fp16
loss scaler (precision.py), the memory estimate (memory_estimate.py, fit.py), the FLOPs peak for MFU
(mfu.py), the summary's `plan` block and the report's labels. So a setting cannot make a run train one
way and be labelled or estimated another: `fsdp=full_shard fsdp.reshard_after_forward=false` *is*
SHARD_GRAD_OP, by every reader.

Strategies, all `fully_shard` on a device mesh:
- full_shard:    1-D mesh over all ranks ("shard");
- shard_grad_op: the same mesh (the preset sets reshard_after_forward=false, ZeRO-2-like);
- hybrid_shard:  2-D mesh ("replicate", "shard"), sharded within groups of `hybrid_group_size` ranks
                 (one group of all ranks: full_shard's 1-D mesh);
- no_shard:      2-D mesh (world x 1): every rank holds everything, gradients all-reduced (DDP-like).
The label users see is derived from the mesh and the reshard policy that result, not from the name
(torch's FSDP1 `ShardingStrategy` names): a shard dimension of 1 is NO_SHARD, one replica group is
FULL_SHARD (resharded after forward) or SHARD_GRAD_OP (kept gathered), several are HYBRID_SHARD or
HYBRID_SHARD_ZERO2.

This module imports nothing heavy (no torch): launchers and analysis read plans too (analysis of a
summary's plain config through Config.of). Dtypes are held
by torch's names; `torch_dtype` turns one into a torch.dtype where a rank needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpo_sweeps.config.schema import STRATEGIES, Config, FsdpConfig, PeftConfig, PrecisionConfig
from dpo_sweeps.errors import InvalidConfig


@dataclass(frozen=True)
class Dtype:
    name: str  # torch's name, as precision.param_dtype / reduce_dtype take it
    short: str  # as labels, precision presets and the FLOPs peak table (mfu.py) name it
    bytes: int


# The project's one dtype table.
DTYPES: dict[str, Dtype] = {d.name: d for d in (Dtype("float32", "fp32", 4), Dtype("bfloat16", "bf16", 2),
                                                 Dtype("float16", "fp16", 2))}


def check_dtype(name: Any, setting: str) -> str:
    """`name` if it is a dtype a run can use; InvalidConfig naming `setting` otherwise."""
    if name not in DTYPES:
        raise InvalidConfig(setting, f"unknown dtype '{name}'", ", ".join(DTYPES))
    return name


def torch_dtype(name: str):
    """The torch.dtype of a dtype name of DTYPES (imports torch)."""
    import torch

    return getattr(torch, check_dtype(name, "dtype"))


@dataclass(frozen=True)
class ParallelPlan:
    sharding_strategy: str  # fsdp.sharding_strategy as set (the preset); `strategy` is what runs
    world_size: int
    mesh_shape: tuple[int, ...]
    mesh_dim_names: tuple[str, ...]
    reshard_after_forward: bool  # the trained model's; a frozen reference always reshards (fsdp.py)
    param_dtype: str  # the compute dtype FSDP casts gathered parameters to (master weights stay fp32)
    reduce_dtype: str  # the dtype gradients are reduced in
    loss_scaling: bool  # dynamic loss scaling with rank-consistent skipped steps (precision.py)
    initial_loss_scale: float  # 1.0 without loss scaling
    loss_scale_growth_interval: int  # 0 without loss scaling
    cpu_offload: bool
    activation_checkpointing: bool
    adapters: str | None = None  # `LoRA r=16` (peft, models/adapters.py); None: a full fine-tune

    @property
    def shard_size(self) -> int:
        """Ranks a parameter is sharded over."""
        return self.mesh_shape[-1]

    @property
    def replicate_size(self) -> int:
        """Copies of each shard (groups that each hold a whole model)."""
        return self.mesh_shape[0] if len(self.mesh_shape) == 2 else 1

    @property
    def strategy(self) -> str:
        """FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, HYBRID_SHARD_ZERO2 or NO_SHARD: what the mesh and the
        reshard policy make of the run."""
        if self.shard_size == 1:
            return "NO_SHARD"
        if self.replicate_size == 1:
            return "FULL_SHARD" if self.reshard_after_forward else "SHARD_GRAD_OP"
        return "HYBRID_SHARD" if self.reshard_after_forward else "HYBRID_SHARD_ZERO2"

    @property
    def compute(self) -> str:
        """The compute dtype's short name (fp32, bf16, fp16): the FLOPs peak MFU compares with (mfu.py)."""
        return DTYPES[self.param_dtype].short

    @property
    def precision(self) -> str:
        """The precision as it runs: the compute dtype, and what departs from fp32 reduction and from
        loss scaling exactly for fp16."""
        extras = []
        if self.reduce_dtype != "float32":
            extras.append(f"{DTYPES[self.reduce_dtype].short} reduce")
        if self.loss_scaling != (self.param_dtype == "float16"):
            extras.append("loss scaling" if self.loss_scaling else "no loss scaling")
        return self.compute + (f" ({', '.join(extras)})" if extras else "")

    @property
    def label(self) -> str:
        """What summaries, logs and reports call the run's layout: `SHARD_GRAD_OP bf16`, `... LoRA r=16`."""
        return f"{self.strategy} {self.precision}" + (f" {self.adapters}" if self.adapters else "")

    @property
    def param_bytes(self) -> int:
        return DTYPES[self.param_dtype].bytes

    @property
    def casts(self) -> bool:
        """Whether the trained model computes or reduces in a dtype other than its fp32 parameters'."""
        return self.param_dtype != "float32" or self.reduce_dtype != "float32"

    @property
    def fully_sharded(self) -> bool:
        """Whether the trained model is wrapped by fully_shard: always on several ranks; on one, only to cast
        or offload (fsdp.py's needs_fully_shard, which a rank asks of its MixedPrecisionPolicy)."""
        return self.world_size > 1 or self.cpu_offload or self.casts

    @property
    def mesh(self) -> dict[str, int]:
        return dict(zip(self.mesh_dim_names, self.mesh_shape))

    def as_dict(self) -> dict[str, Any]:
        """summary.json's `plan` block (INTERFACE.md)."""
        return {
            "label": self.label, "strategy": self.strategy, "precision": self.precision,
            "sharding_strategy": self.sharding_strategy, "world_size": self.world_size, "mesh": self.mesh,
            "reshard_after_forward": self.reshard_after_forward,
            "param_dtype": self.param_dtype, "reduce_dtype": self.reduce_dtype,
            "loss_scaling": {"initial_scale": self.initial_loss_scale,
                             "growth_interval": self.loss_scale_growth_interval} if self.loss_scaling else None,
            "cpu_offload": self.cpu_offload, "activation_checkpointing": self.activation_checkpointing,
            "adapters": self.adapters,
        }


def mesh_of(fsdp: FsdpConfig, world_size: int, nproc_per_node: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The device mesh's shape and dimension names for `fsdp.sharding_strategy` on `world_size` ranks."""
    strategy = fsdp.sharding_strategy
    if strategy not in STRATEGIES:
        raise InvalidConfig("fsdp.sharding_strategy", f"unknown strategy '{strategy}'", ", ".join(STRATEGIES))
    if strategy == "hybrid_shard":
        group = fsdp.hybrid_group_size or nproc_per_node
        if not isinstance(group, int) or isinstance(group, bool) or group < 1 or world_size % group:
            raise InvalidConfig(
                "fsdp.hybrid_group_size", f"{group!r} does not divide the {world_size} ranks",
                "a divisor of resources.nodes * resources.nproc_per_node (null: the ranks of one node)",
            )
        if group < world_size:
            return (world_size // group, group), ("replicate", "shard")
        # One shard group over all ranks: a full shard, on the same 1-D mesh as fsdp=full_shard.
        return (world_size,), ("shard",)
    if strategy == "no_shard":
        return (world_size, 1), ("replicate", "shard")
    return (world_size,), ("shard",)


def check_fsdp_config(fsdp: FsdpConfig, world_size: int, nproc_per_node: int, device_type: str | None) -> None:
    """The fsdp group's checks that need no model. `device_type`: cpu or cuda, or None where it is not
    known yet (resources.device=auto before the job is on its node: the rank checks again with the
    device it got)."""
    mesh_of(fsdp, world_size, nproc_per_node)
    if fsdp.cpu_offload and device_type == "cpu":
        raise InvalidConfig("fsdp.cpu_offload", "true on a CPU-only run (parameters are already in CPU memory)",
                            "false, or true on GPUs (resources.device=cuda, or auto where there is a GPU)")


def _loss_scale_setting(precision: PrecisionConfig, key: str):
    """A loss-scaling setting (the schema gives every precision one; a config of an older run may hold null)."""
    value = getattr(precision, key)
    if value is None:
        raise InvalidConfig(f"precision.{key}", "not set while precision.loss_scaling is true",
                            "a number > 0 (conf/precision/fp16.yaml sets one)")
    return value


def resolve_plan(cfg: Config, world_size: int | None = None) -> ParallelPlan:
    """The plan of a resolved, typed config (Config.of), from its `fsdp`, `precision` and `resources`
    sections. `world_size`: the ranks the run has (default: resources.nodes x resources.nproc_per_node).
    Raises InvalidConfig for a setting that cannot be planned."""
    fsdp, precision, resources = cfg.fsdp, cfg.precision, cfg.resources
    world = int(world_size if world_size is not None else resources.world_size)
    shape, names = mesh_of(fsdp, world, resources.nproc_per_node)
    scaling = bool(precision.loss_scaling)
    return ParallelPlan(
        sharding_strategy=fsdp.sharding_strategy, world_size=world, mesh_shape=shape, mesh_dim_names=names,
        reshard_after_forward=bool(fsdp.reshard_after_forward),
        param_dtype=check_dtype(precision.param_dtype, "precision.param_dtype"),
        reduce_dtype=check_dtype(precision.reduce_dtype, "precision.reduce_dtype"),
        loss_scaling=scaling,
        initial_loss_scale=float(_loss_scale_setting(precision, "initial_loss_scale")) if scaling else 1.0,
        loss_scale_growth_interval=int(_loss_scale_setting(precision, "loss_scale_growth_interval")) if scaling else 0,
        cpu_offload=bool(fsdp.cpu_offload), activation_checkpointing=bool(fsdp.activation_checkpointing),
        adapters=adapters_label(cfg.peft),
    )


def adapters_label(peft: PeftConfig) -> str | None:
    """How labels name a run's adapters: `LoRA r=16` (DoRA, rsLoRA alike; `QLoRA r=16` on a 4-bit base);
    None for a full fine-tune."""
    if peft.method == "none":
        return None
    kind = "DoRA" if peft.use_dora else "rsLoRA" if peft.use_rslora else "LoRA"
    return f"{'Q' if peft.method == 'qlora' else ''}{kind} r={peft.r}"
