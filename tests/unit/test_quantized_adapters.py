"""peft=qlora in one process: its settings are checked before launch, the reference (the 4-bit base with the
adapters off, run in eval mode without grad) is unchanged by training steps, and the memory estimate
counts the 4-bit weights (issue 36)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dpo_sweeps import api
from dpo_sweeps.checks.unused import check_settings_used
from dpo_sweeps.checks.validate import validate_config
from dpo_sweeps.config.schema import Config
from dpo_sweeps.dpo.adapter_reference import AdapterReference
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.models.adapters import add_adapters
from dpo_sweeps.models.tokenizers import byte_tokenizer

LLAMA = ("model=tiny_llama", "peft=qlora", "peft.r=4")


def config(*overrides: str) -> Config:
    values = OmegaConf.to_container(api.compose(overrides), resolve=False)
    values.pop("hydra", None)
    return Config.of(OmegaConf.to_container(OmegaConf.create(values), resolve=True))


def _logps(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize(("overrides", "message"), [
    ([*LLAMA, "peft.quantization=int8"], "peft.quantization: unknown 4-bit type 'int8' (accepted: nf4 or fp4"),
    ([*LLAMA, "peft.bnb_4bit_compute_dtype=int8"], "peft.bnb_4bit_compute_dtype: got 'int8'"),
    ([*LLAMA, "precision=bf16", "peft.bnb_4bit_quant_storage=float32"],
     "peft.bnb_4bit_quant_storage: float32 with precision=bf16 (param_dtype bfloat16): FSDP2 would cast the "
     "packed 4-bit weights (accepted: null or bfloat16"),
    ([*LLAMA, "train.save_merged=true"], "train.save_merged: true with peft=qlora"),
    (["peft=qlora"], "peft: qlora with GPT2LMHeadModel, whose blocks have no nn.Linear layers"),
])
def test_bad_qlora_settings_are_refused_in_one_line_before_launch(overrides, message):
    with pytest.raises(InvalidConfig) as refused:
        validate_config(config(*overrides), Path("."))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_qlora_without_bitsandbytes_is_refused_before_launch(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # what an import finds where it is not installed
    with pytest.raises(InvalidConfig) as refused:
        validate_config(config(*LLAMA), Path("."))
    assert str(refused.value).startswith("peft: qlora: bitsandbytes is not installed (pip install -e '.[qlora]'")
    assert "peft=lora" in str(refused.value) and "\n" not in str(refused.value)


def test_quantization_keys_without_qlora_are_refused():
    with pytest.raises(InvalidConfig, match="peft.double_quant: set, but not read here"):
        check_settings_used(config("peft=lora", "peft.double_quant=true"), ["peft.double_quant=true"])


@pytest.mark.parametrize("double_quant", [False, True])
def test_the_4bit_reference_is_unchanged_by_training(double_quant):
    """The reference pass (eval mode, no grad) gives the 4-bit base's log-probs through training steps,
    with and without double quantization. (In one process bitsandbytes' in-place repack for its CPU
    kernel stays self-consistent; under FSDP2 it does not: tests/integration/test_qlora.py.)"""
    from dpo_sweeps.models.build import build_policy
    from dpo_sweeps.models.quantize import quantize_base

    cfg = config(*LLAMA, "model.from_config.intermediate_size=128", f"peft.double_quant={double_quant}")
    base = quantize_base(build_policy(cfg.model, byte_tokenizer(), 0), cfg.peft, cfg.model.block_name, "float32",
                         torch.device("cpu")).eval()
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = _logps(base, ids)
    policy = add_adapters(copy.deepcopy(base), cfg.peft, cfg.model.block_name).train()
    reference = AdapterReference(policy)
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    for _ in range(3):  # a reference pass first, as a step without precomputed log-probs runs it
        assert torch.equal(_logps(reference, ids), expected)
        _logps(policy, ids).sum().neg().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert torch.equal(_logps(reference, ids), expected)
    with torch.no_grad():
        assert not torch.equal(_logps(policy.eval(), ids), expected)  # the adapters trained


def test_the_memory_estimate_counts_4bit_base_weights():
    import bitsandbytes as bnb

    from dpo_sweeps.models.build import build_policy
    from dpo_sweeps.models.quantize import quantize_base
    from dpo_sweeps.parallel.fit import _with_adapters, architecture_key, model_shape, peft_key
    from dpo_sweeps.parallel.memory_estimate import RunShape, gathered_params, model_states

    lora, qlora = config("model=tiny_llama", "peft=lora", "peft.r=4"), config(*LLAMA)
    shapes = [_with_adapters(model_shape(c.model), architecture_key(c.model), peft_key(c)) for c in (lora, qlora)]

    model = quantize_base(build_policy(qlora.model, byte_tokenizer(), 0), qlora.peft, qlora.model.block_name,
                          "float32", torch.device("cpu"))
    four_bit = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert shapes[0].quantized_params == 0
    assert shapes[1].quantized_params == sum(m.in_features * m.out_features for m in four_bit) > 0
    assert shapes[1].quantized_bytes == sum(m.weight.numel() * m.weight.element_size() for m in four_bit)
    run = RunShape(shard_group_size=2, param_dtype="float32", optimizer="adamw", micro_batch_size=2, seq_len=64)
    saved = 4 * shapes[1].quantized_params - shapes[1].quantized_bytes  # fp32 weights against packed 4-bit
    assert model_states(shapes[0], run) - model_states(shapes[1], run) == pytest.approx(
        saved / 2 - shapes[1].scale_bytes, abs=2)
    assert gathered_params(shapes[1], run) < gathered_params(shapes[0], run)
