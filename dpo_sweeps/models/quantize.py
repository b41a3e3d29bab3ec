"""peft=qlora: the frozen base's linear layers in 4-bit through bitsandbytes, for LoRA adapters on top.

transformers quantizes only inside `from_pretrained`, and dpo-sweeps builds its models in fp32 (random-init
from a config, GGUF, or `from_pretrained`): so each nn.Linear of the blocks is swapped for bitsandbytes'
`Linear4bit` holding the same weights, which bitsandbytes quantizes itself (`Params4bit`, NF4 or FP4). The
packed 4-bit weights are stored in a float dtype (`quant_storage`) so that FSDP2 shards them as any other
parameter; that dtype is the precision's param_dtype, so FSDP2's mixed precision never casts the packed
bits (checks/validate.py refuses another).

Two traps (issue 36):
- On a CPU with AVX-512 BF16, `Linear4bit` repacks its weight in place into a layout for its CPU kernel
  whenever the layer runs in eval mode on an input that needs no grad, which is exactly the reference pass
  of an adapter run (models/adapters.py `reference_mode`). The repacked weight is not what the training
  forward, backward and FSDP2's shards expect: gradients come out wrong and the frozen reference drifts.
  The repack is switched off on every layer (`support_avx512bf16_for_cpu`).
- GPT-2's linear layers are transformers' Conv1D (transposed weights), which `Linear4bit` is not:
  peft=qlora is refused for them before launch (`check_quantizable`).
"""

from __future__ import annotations

import importlib.util
import platform

import torch

from dpo_sweeps.config.schema import PeftConfig
from dpo_sweeps.errors import InvalidConfig

QLORA_INSTALL = "pip install -e '.[qlora]' (bitsandbytes 0.50)"


def bitsandbytes_problem() -> str | None:
    """Why bitsandbytes' 4-bit layers cannot run on this machine's CPU, or None (cheap: no import of it)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return f"bitsandbytes is not installed ({QLORA_INSTALL})"
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if x86 and torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "this CPU has no AVX2, which bitsandbytes' CPU 4-bit kernels need"
    return None


def quantization_settings(peft_cfg: PeftConfig) -> dict | None:
    """What besides the packed weights decides a 4-bit base's numbers (the quantization constants, the
    matmul's dtype), for the cache key of precomputed reference log-probs; None without peft=qlora."""
    if peft_cfg.method != "qlora":
        return None
    return {"type": peft_cfg.quantization, "double_quant": peft_cfg.double_quant,
            "compute_dtype": peft_cfg.bnb_4bit_compute_dtype}


def quantizable_linears(model: torch.nn.Module, block_name: str) -> list[tuple[torch.nn.Module, str]]:
    """(parent, attribute) of every nn.Linear inside the blocks: the layers peft=qlora stores in 4-bit."""
    found = []
    for block in (m for m in model.modules() if type(m).__name__ == block_name):
        for parent in block.modules():
            found.extend((parent, name) for name, child in parent.named_children()
                         if type(child) is torch.nn.Linear)
    return found


def quantizable_params(model: torch.nn.Module, block_name: str) -> int:
    """How many weights peft=qlora stores in 4-bit (those of `quantizable_linears`), counted before packing."""
    return sum(getattr(parent, name).weight.numel() for parent, name in quantizable_linears(model, block_name))


def check_quantizable(model: torch.nn.Module, block_name: str) -> None:
    """The blocks have nn.Linear layers, not only Conv1D ones (GPT-2), for bitsandbytes to quantize."""
    from transformers.pytorch_utils import Conv1D

    if any(isinstance(m, Conv1D) for m in model.modules()) or not quantizable_linears(model, block_name):
        raise InvalidConfig("peft", f"qlora with {type(model).__name__}, whose blocks have no nn.Linear layers "
                            "for bitsandbytes' Linear4bit (GPT-2's are transposed Conv1D)",
                            "peft=lora for this model, or peft=qlora with a model such as model=tiny_llama")


def quantize_base(model: torch.nn.Module, peft_cfg: PeftConfig, block_name: str, param_dtype: str,
                  device: torch.device) -> torch.nn.Module:
    """`model` with every nn.Linear of its blocks replaced by a frozen bitsandbytes Linear4bit (in place),
    quantized on `device` (its quantization constants live there) and stored packed in the precision's
    param dtype (`peft.bnb_4bit_quant_storage`, checked equal to it before launch)."""
    import bitsandbytes as bnb

    storage = getattr(torch, peft_cfg.bnb_4bit_quant_storage or param_dtype)
    compute = getattr(torch, peft_cfg.bnb_4bit_compute_dtype or param_dtype)
    for parent, name in quantizable_linears(model, block_name):
        linear = getattr(parent, name)
        layer = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                  compute_dtype=compute, compress_statistics=peft_cfg.double_quant,
                                  quant_type=peft_cfg.quantization, quant_storage=storage, device="meta")
        layer.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False,
                                         compress_statistics=peft_cfg.double_quant,
                                         quant_type=peft_cfg.quantization, quant_storage=storage,
                                         module=layer).to(device)  # bitsandbytes quantizes here
        if linear.bias is not None:
            layer.bias = torch.nn.Parameter(linear.bias.data.to(device), requires_grad=False)
        layer.support_avx512bf16_for_cpu = False  # no in-place repack in eval mode (module docstring)
        layer.train(linear.training)
        setattr(parent, name, layer)
    model.requires_grad_(False)  # the base is frozen; peft's adapters, added next, train
    return model
