"""LoRA adapters on the policy (`peft=lora`), built with the `peft` library, and the reference they make free.

The policy is the model itself with peft's LoRA layers injected (`get_peft_model(...).base_model.model`):
FSDP2 shards it per block as it shards a full fine-tune, the frozen base weights beside the trainable
adapter weights in the same units (per-parameter sharding allows this; the trainable ones share fp32).

The reference is the same model with its adapters switched off (`AdaptersOff`), as TRL does with a
`peft_config`: no second model is built or sharded. Two of peft's ways of switching adapters off go
silently wrong under FSDP2 (issue 36): `disable_adapter()` also turns `requires_grad` off, and FSDP2
records which parameters train at the first forward, so a reference pass first leaves adapters that never
get a gradient (or a bf16 backward that fails). `AdaptersOff` sets only the layers' disable flag.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from dpo_sweeps.config.schema import PeftConfig
from dpo_sweeps.errors import InvalidConfig

ADAPTER_NAME = "default"  # peft's name for a model's only adapter
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# peft's prefix of a model's parameter names inside a PeftModel (the keys of a saved adapter).
PEFT_PREFIX = "base_model.model."


def linear_names(model: torch.nn.Module, block_name: str) -> list[str]:
    """The leaf names of the linear layers inside the model's blocks (nn.Linear, and GPT-2's Conv1D)."""
    from transformers.pytorch_utils import Conv1D

    names = set()
    for block in (m for m in model.modules() if type(m).__name__ == block_name):
        names.update(name.rsplit(".", 1)[-1] for name, m in block.named_modules()
                     if isinstance(m, torch.nn.Linear | Conv1D))
    return sorted(names)


def target_modules(model: torch.nn.Module, peft_cfg: PeftConfig, block_name: str) -> list[str]:
    """peft.target_modules, or every linear layer of the blocks; a name the model lacks is refused."""
    available = linear_names(model, block_name)
    if peft_cfg.target_modules is None:
        return available
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [name for name in peft_cfg.target_modules if name not in leaves]
    if missing:
        raise InvalidConfig("peft.target_modules", f"{type(model).__name__} has no module named "
                            f"{', '.join(repr(m) for m in missing)}",
                            f"names of its linear layers: {', '.join(available)} (null: all of them)")
    return list(peft_cfg.target_modules)


def lora_config(model: torch.nn.Module, peft_cfg: PeftConfig, block_name: str):
    """The peft LoraConfig of a run's `peft` section, for `model`."""
    from peft import LoraConfig
    from transformers.pytorch_utils import Conv1D

    targets = target_modules(model, peft_cfg, block_name)
    # GPT-2 stores its linear weights transposed (Conv1D): peft needs to know.
    fan_in_fan_out = any(isinstance(m, Conv1D) and name.rsplit(".", 1)[-1] in targets
                         for name, m in model.named_modules())
    return LoraConfig(r=peft_cfg.r, lora_alpha=peft_cfg.alpha, lora_dropout=peft_cfg.dropout,
                      target_modules=targets, use_rslora=peft_cfg.use_rslora, use_dora=peft_cfg.use_dora,
                      modules_to_save=list(peft_cfg.modules_to_save) if peft_cfg.modules_to_save else None,
                      fan_in_fan_out=fan_in_fan_out, bias="none", task_type="CAUSAL_LM")


def add_adapters(model: torch.nn.Module, peft_cfg: PeftConfig, block_name: str) -> torch.nn.Module:
    """`model` with LoRA layers injected (in place; only the adapter weights train). The same seed gives
    the same adapter initialization on every rank (LoRA's B starts at zero: the policy starts as the base)."""
    from peft import get_peft_model

    _check_modules_to_save(model, peft_cfg)
    return get_peft_model(model, lora_config(model, peft_cfg, block_name)).base_model.model


def has_adapters(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def _adapter_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """peft's layers that an adapter acts in (LoRA layers, modules_to_save wrappers): each has the flag."""
    return [m for m in model.modules() if hasattr(m, "_disable_adapters")]


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run `model` as its base: each adapter layer's disable flag set, `requires_grad` left as it is
    (peft's own `disable_adapter()` turns it off: see the module docstring), eval mode (no dropout, as the
    reference of a full fine-tune)."""
    layers, training = _adapter_layers(model), model.training
    for layer in layers:
        layer._disable_adapters = True
    model.eval()
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False
        model.train(training)


class AdaptersOff:
    """The reference of an adapter run: the policy itself with its adapters switched off, under no grad.

    It is called as the reference model is (response_logps.py: the model's call, or its response-positions
    scoring method, which goes through the policy's FSDP root); its parameters are the base's (the cache
    key of precomputed log-probs names the base weights).
    """

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy
        self.config = policy.config

    def __call__(self, *args, **kwargs):
        with torch.no_grad(), adapters_disabled(self.policy):
            return self.policy(*args, **kwargs)

    def __getattr__(self, name: str):
        from dpo_sweeps.dpo.response_logps import METHOD, enable_chunked_logps

        if name != METHOD:
            raise AttributeError(name)
        enable_chunked_logps(self.policy)
        method = getattr(self.policy, METHOD)

        def scored(*args, **kwargs):
            with torch.no_grad(), adapters_disabled(self.policy):
                return method(*args, **kwargs)
        return scored

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The base model's parameters under the base model's names (adapter weights left out)."""
        for name, param in self.policy.named_parameters():
            if ".lora_" in name or ".modules_to_save." in name:
                continue
            yield name.replace(".base_layer.", ".").replace(".original_module.", "."), param


def adapter_state(full_state: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights of a gathered (full) state dict of `model`, keyed as a PeftModel saves them."""
    from peft.utils import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, state_dict=full_state, save_embedding_layers=False)
    return {PEFT_PREFIX + k: v for k, v in state.items()}


def save_adapter(model: torch.nn.Module, full_state: dict[str, torch.Tensor], path: Path,
                 base_name: str) -> None:
    """Write `path` as a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) that
    `PeftModel.from_pretrained(base, path)` loads; rank 0, from the gathered state dict."""
    from safetensors.torch import save_file

    config = model.peft_config[ADAPTER_NAME]
    config.base_model_name_or_path = base_name
    path.mkdir(parents=True, exist_ok=True)
    weights = {k: v.contiguous() for k, v in adapter_state(full_state, model).items()}
    save_file(weights, str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config.save_pretrained(str(path))


def merged_model(model: torch.nn.Module, full_state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A plain transformers model with the adapters merged into the base weights (rank 0, CPU)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    config = model.peft_config[ADAPTER_NAME]
    base = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    peft_model = get_peft_model(base, _copy_config(config))
    peft_model.base_model.model.load_state_dict(full_state, strict=True)
    return peft_model.merge_and_unload()


def _copy_config(config):
    from peft import LoraConfig

    return LoraConfig(**{k: v for k, v in config.to_dict().items() if k in LoraConfig.__dataclass_fields__
                         and k not in ("peft_type", "revision")})


def read_adapter_config(path: Path) -> dict:
    return json.loads((path / ADAPTER_CONFIG).read_text())


def check_adapter_targets(model_cfg, peft_cfg: PeftConfig) -> None:
    """Before launch: peft.target_modules and modules_to_save name modules of the model's architecture
    (built on the meta device from its config; a model whose config cannot be read here is checked when
    it is built)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        if model_cfg.from_config is not None and model_cfg.init_from is None:
            spec = dict(model_cfg.from_config)
            config = AutoConfig.for_model(spec.pop("model_type", None), **spec)
        elif model_cfg.gguf_file is None:
            from dpo_sweeps.models.build import saved_model_path

            source = saved_model_path(model_cfg.init_from) if model_cfg.init_from else model_cfg.name_or_path
            config = AutoConfig.from_pretrained(source)
        else:
            return
    except (OSError, ValueError):
        return
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    target_modules(model, peft_cfg, model_cfg.block_name)
    _check_modules_to_save(model, peft_cfg)


def _check_modules_to_save(model: torch.nn.Module, peft_cfg: PeftConfig) -> None:
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    for name in peft_cfg.modules_to_save or ():
        if name not in leaves:
            raise InvalidConfig("peft.modules_to_save", f"{type(model).__name__} has no module named '{name}'",
                                "null, or names of its modules such as lm_head")
