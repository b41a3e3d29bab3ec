"""`train.compile`: each transformer block's forward compiled by torch.compile, block by block.

torchtitan's approach (`apply_compile`): the blocks of a model are identical code, so compiling each
block on its own yields one graph that every block reuses (parameters are graph inputs, not
constants), so the compile is paid once however deep the model, and the embeddings, the LM head and
the log-prob scoring stay eager. It is applied before `fully_shard` (parallel/fsdp.py), and also to a
model that runs unwrapped. On a CPU inductor generates C++ and builds it with the C++ compiler it finds
(`torch._inductor.cpp_builder.get_cpp_compiler`); on CUDA it generates Triton kernels.

What is compiled, and why:
- The block's `forward` method, not the block module (torchtitan swaps in an OptimizedModule): the
  hooks a block's `__call__` runs stay eager and outside the graph (FSDP2's unshard and reshard, the
  trainer's per-block heartbeat), and the block keeps its class and its parameter names (an
  OptimizedModule would add `_orig_mod.` to every name a checkpoint or saved model holds).
  transformers' activation checkpointing (fsdp.activation_checkpointing) runs inside that forward, so
  it is compiled with it, as torchtitan compiles a block after wrapping it for checkpointing.
- `dynamic=True`: micro-batches are ragged (each is padded to its own longest row, or is one
  prefix-shared row per pair), so the sequence length, and the batch of a last eval pass, change from
  one call to the next. Compiled with symbolic sizes from the first call, a new length reuses the graph;
  with static sizes dynamo would compile the first length, then recompile once a second length arrives.
  The parameters' sizes stay static (torch's default), so only the batch and sequence dims are symbolic.
- The attention is the model's own (SDPA with the 2-D padding mask or train.share_prompt's 4-D boolean
  mask, eager, FlexAttention): the compiled graph holds whatever the block calls.
- Graphs per run: one for training (with grad), one for passes without grad (evaluation, the
  zero-shot baseline, LoRA's adapters-off reference), and a batch of one row (sizes 0 and 1 are always
  specialized) or adapters switched off add one each; well under dynamo's per-code recompile limit
  (`torch._dynamo.config.recompile_limit`, 8), past which it would run the block eagerly.
- The frozen reference model (a full fine-tune's copy of the policy) is not compiled: by default its
  log-probs are precomputed once before training (a single pass would mostly pay the compile), and
  its blocks, with frozen parameters, would need a graph of their own on every rank. LoRA's reference
  is the policy itself with its adapters off, so it runs the compiled blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from dpo_sweeps.errors import InvalidConfig

__all__ = ["check_compile_support", "compile_blocks", "compile_problem", "is_compiled"]

ACCEPTED = "false, or true where torch.compile can build its kernels"


@functools.cache
def compile_problem(device_type: str, on_device: bool = True) -> str | None:
    """Why torch.compile cannot compile a block for `device_type` (resources.device: auto, cpu, cuda) on
    this machine, in words that name what to install; None when it can. `on_device`: this machine is the
    one the rank computes on (else the GPU's Triton is left to the rank: it needs the GPU to tell)."""
    from torch._dynamo.eval_frame import check_if_dynamo_supported

    try:
        check_if_dynamo_supported()  # the Python versions torch.compile refuses
    except RuntimeError as exc:
        return f"{exc} (use a Python torch.compile supports)"
    if device_type not in ("auto", "cpu", "cuda"):
        return f"no inductor backend for device '{device_type}' (cpu and cuda have one)"
    # Inductor builds C++ for the CPU and the host side of a GPU graph; its search is CXX, else g++.
    from torch._inductor import config, exc
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        tried = ", ".join(c for c in config.cpp.cxx if c) if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx
        tried = tried or "CXX, set empty"
        return (f"inductor finds no C++ compiler (tried {tried}); install g++ (apt install g++) or set CXX "
                f"to a C++ compiler")
    if device_type == "cuda" and on_device:
        from torch.utils._triton import has_triton

        if not has_triton():  # also false for a GPU older than Triton supports
            return "inductor needs Triton on this GPU (pip install triton; a GPU of compute capability >= 7.0)"
    return None


def check_compile_support(device_type: str, on_device: bool = True) -> None:
    """Refuse train.compile=true in one line where torch.compile cannot compile for `device_type`."""
    if problem := compile_problem(device_type, on_device):
        raise InvalidConfig("train.compile", f"true with resources.device={device_type}: {problem}", ACCEPTED)


def compile_blocks(blocks: Sequence[torch.nn.Module], device: torch.device) -> None:
    """Compile each block's forward in place (see the module docstring). Checked again here, on the
    node the rank runs on: a sweep's pre-launch check ran on the launching machine."""
    check_compile_support(device.type)
    if any(getattr(block, "gradient_checkpointing", False) for block in blocks):
        # transformers checkpoints inside the block's forward (GradientCheckpointingLayer), which dynamo
        # traces as its checkpoint operator, recomputed within the compiled backward. It refuses a forward
        # that sets a Python variable outside the operator (transformers' hub-kernel layers set a
        # ContextVar) unless told not to replay that in the recompute, and would then run the whole block
        # eagerly, silently. Only eager recomputation replays Python; a compiled graph has none to replay.
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    for block in blocks:
        block.forward = torch.compile(block.forward, dynamic=True)


def is_compiled(block: torch.nn.Module) -> bool:
    """Whether `compile_blocks` compiled this block's forward."""
    return hasattr(block.__dict__.get("forward"), "_torchdynamo_orig_callable")
