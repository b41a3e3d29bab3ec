"""Mixed precision: FSDP2's policy for compute and reduction, and dynamic loss scaling for fp16.

FSDP2 has no ShardedGradScaler, and a per-rank GradScaler would let ranks disagree on skipping a
step (each sees only its gradient shard). This scaler all-reduces the overflow flag, so every rank
skips or steps together.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy

from dpo_sweeps.parallel.plan import ParallelPlan, torch_dtype


def mixed_precision_policy(plan: ParallelPlan) -> MixedPrecisionPolicy:
    """FSDP2's policy for the trained model: compute in the plan's param_dtype, reduce in its reduce_dtype."""
    return MixedPrecisionPolicy(param_dtype=torch_dtype(plan.param_dtype), reduce_dtype=torch_dtype(plan.reduce_dtype))


def slow_on_this_cpu(dtype: str) -> str | None:
    """Why computing in `dtype` (a torch dtype name) is slow on this machine's CPU, or None. oneDNN's bf16
    kernels need AVX-512 (its fp16 ones AVX-512 FP16 or AMX); without them torch runs half-precision matmuls
    on a generic path, many times slower than fp32's."""
    kernels = {"bfloat16": ("bf16", torch.ops.mkldnn._is_mkldnn_bf16_supported),
               "float16": ("fp16", torch.ops.mkldnn._is_mkldnn_fp16_supported)}
    if dtype not in kernels:
        return None
    short, supported = kernels[dtype]
    if supported():
        return None
    return (f"oneDNN has no {short} kernels for this CPU (torch sees {torch.backends.cpu.get_cpu_capability()}), "
            f"so {short} matmuls take a generic path, many times slower than fp32's; precision=fp32 is faster here")


def loss_scaler(plan: ParallelPlan) -> DynamicLossScaler:
    """The plan's loss scaler (one that never scales where the plan has no loss scaling)."""
    return DynamicLossScaler(enabled=plan.loss_scaling, initial_scale=plan.initial_loss_scale,
                             growth_interval=plan.loss_scale_growth_interval)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class DynamicLossScaler:
    """Scale the loss up before backward; halve the scale and skip the step on overflow."""

    def __init__(self, enabled: bool, initial_scale: float = 2.0**16, growth_interval: int = 2000):
        self.enabled = enabled
        self.scale = float(initial_scale) if enabled else 1.0
        self.growth_interval = growth_interval
        self._good_steps = 0
        self.skipped_steps = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_and_check(self, params: list[torch.nn.Parameter]) -> bool:
        """Unscale gradients in place; True when any rank saw inf/NaN (then the step is skipped)."""
        if not self.enabled:
            return False
        grads = [_local(p.grad) for p in params if p.grad is not None]
        device = grads[0].device if grads else torch.device("cpu")
        # One flag for all gradients, stacked on the device and read once: a Python test per gradient
        # would make the CPU wait for the GPU once per parameter.
        overflow = torch.zeros(1, device=device)
        if grads:
            overflow = (~torch.stack([torch.isfinite(g).all() for g in grads]).all()).float().reshape(1)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(overflow, op=dist.ReduceOp.MAX)
        found = bool(overflow.item())
        if not found:
            torch._foreach_mul_(grads, 1.0 / self.scale)
        return found

    def update(self, overflow: bool) -> None:
        if not self.enabled:
            return
        if overflow:
            self.scale /= 2.0
            self._good_steps = 0
            self.skipped_steps += 1
        else:
            self._good_steps += 1
            if self._good_steps % self.growth_interval == 0:
                self.scale *= 2.0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self._good_steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self._good_steps, self.skipped_steps = state["scale"], state["good_steps"], state["skipped_steps"]
