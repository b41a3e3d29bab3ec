"""LoRA adapters on the policy (`peft=lora`; `peft=qlora` on a 4-bit base: models/quantize.py), built
with the `peft` library, and the reference they make free.

The policy is the model itself with peft's LoRA layers injected (`get_peft_model(...).base_model.model`):
FSDP2 shards it per block as it shards a full fine-tune, the frozen base weights beside the trainable
adapter weights in the same units (per-parameter sharding allows this; the trainable ones share fp32).

The reference is the same model with its adapters switched off (dpo/adapter_reference.py `AdapterReference`), as TRL does with a
`peft_config`: no second model is built or sharded. A run that starts from an adapter (`model.init_from`
naming an earlier peft run) trains a copy of it, and the reference is a second, frozen copy (TRL's
`ref_adapter_name`), not the bare base. peft's own switches go silently wrong under FSDP2 (issue 36):
`disable_adapter()` and `set_adapter()` also change `requires_grad`, and FSDP2 records which parameters
train at the first forward, so a reference pass first leaves adapters that never get a gradient (or a
bf16 backward that fails). `reference_mode` sets only the layers' flags.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from dpo_sweeps.config.schema import PeftConfig
from dpo_sweeps.errors import InvalidConfig

ADAPTER_NAME = "default"  # peft's name for a model's only adapter: the policy's, the one that trains
REFERENCE_ADAPTER = "reference"  # a frozen copy of the adapter a run started from (model.init_from)
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


def add_adapters(model: torch.nn.Module, peft_cfg: PeftConfig, block_name: str,
                 start: Path | None = None, reference_copy: bool = False) -> torch.nn.Module:
    """`model` with LoRA layers injected (in place; only the adapter weights train). The same seed gives
    the same adapter initialization on every rank (LoRA's B starts at zero: the policy starts as the base).
    `start`: an adapter folder (an earlier run's model/): the policy trains a copy of it, and a second,
    frozen copy is the reference (TRL's ref_adapter_name). `reference_copy`: a frozen copy of the new
    adapter is the reference (TR-DPO moves it toward the policy's: train/reference_sync.py)."""
    from peft import PeftModel, get_peft_model

    if start is not None:
        peft_model = PeftModel.from_pretrained(model, str(start), adapter_name=ADAPTER_NAME, is_trainable=True)
        peft_model.load_adapter(str(start), adapter_name=REFERENCE_ADAPTER, is_trainable=False)
        return peft_model.base_model.model
    _check_modules_to_save(model, peft_cfg)
    config, reference_config = (lora_config(model, peft_cfg, block_name) for _ in range(2))  # before injection
    peft_model = get_peft_model(model, config)
    if reference_copy:
        peft_model.add_adapter(REFERENCE_ADAPTER, reference_config)
        params = dict(peft_model.base_model.model.named_parameters())
        for name, param in params.items():
            if f".{REFERENCE_ADAPTER}." in name:
                param.data.copy_(params[name.replace(f".{REFERENCE_ADAPTER}.", f".{ADAPTER_NAME}.")].data)
            param.requires_grad_(f".{ADAPTER_NAME}." in name)  # only the policy's adapter trains
    return peft_model.base_model.model


def has_adapters(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def _adapter_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """peft's layers that an adapter acts in (LoRA layers, modules_to_save wrappers): each has the flags."""
    return [m for m in model.modules() if hasattr(m, "_disable_adapters")]


def has_reference_adapter(model: torch.nn.Module) -> bool:
    """Whether the reference is an adapter of its own (an SFT adapter the run started from), not the base."""
    return REFERENCE_ADAPTER in getattr(model, "peft_config", {})


@contextlib.contextmanager
def reference_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run `model` as its reference: the base (each adapter layer's disable flag set) or, when the run
    started from an adapter, that adapter's frozen copy (each layer's active adapter switched to it).
    `requires_grad` is left as it is (peft's own `disable_adapter()` and `set_adapter()` change it: see the
    module docstring); eval mode (no dropout, as the reference of a full fine-tune)."""
    layers, training = _adapter_layers(model), model.training
    to_reference = has_reference_adapter(model)
    saved = [(layer._disable_adapters, layer._active_adapter) for layer in layers]
    for layer in layers:
        if to_reference:
            layer._active_adapter = [REFERENCE_ADAPTER]
        else:
            layer._disable_adapters = True
    model.eval()
    try:
        yield
    finally:
        for layer, (disabled, active) in zip(layers, saved, strict=True):
            layer._disable_adapters, layer._active_adapter = disabled, active
        model.train(training)


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
    """A plain transformers model with the policy's adapter merged into the base weights (rank 0, CPU)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    config = model.peft_config[ADAPTER_NAME]
    base = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    peft_model = get_peft_model(base, _copy_config(config))
    policy_state = {k: v for k, v in full_state.items() if f".{REFERENCE_ADAPTER}." not in k}
    peft_model.base_model.model.load_state_dict(policy_state, strict=True)
    return peft_model.merge_and_unload()


def _copy_config(config):
    from peft import LoraConfig

    return LoraConfig(**{k: v for k, v in config.to_dict().items() if k in LoraConfig.__dataclass_fields__
                         and k not in ("peft_type", "revision")})


def is_adapter_folder(path: Path) -> bool:
    return (path / ADAPTER_CONFIG).exists()


def check_start_adapter(folder: Path, init_from: str, model_cfg, peft_cfg: PeftConfig) -> None:
    """model.init_from naming a run whose model/ is an adapter folder: whole, for this base, with peft on."""
    from safetensors import SafetensorError, safe_open

    if peft_cfg.method == "none":
        raise InvalidConfig("model.init_from", f"'{init_from}' holds a LoRA adapter, not a model, and peft=none",
                            "peft=lora (the policy trains a copy of the adapter), or a run with a full model")
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
        with safe_open(str(folder / ADAPTER_WEIGHTS), framework="pt") as weights:
            for key in weights.keys():  # reads every tensor: a file cut short fails here, not mid-run
                weights.get_tensor(key)
    except (OSError, ValueError, SafetensorError) as exc:
        raise InvalidConfig("model.init_from", f"the adapter in {folder} is incomplete or unreadable "
                            f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                            "the directory of a completed peft=lora run, its model/ whole") from None
    base = config.get("base_model_name_or_path")
    if base != model_cfg.name_or_path:
        raise InvalidConfig("model.init_from", f"the adapter in {folder} was trained on '{base}', "
                            f"this run's model is '{model_cfg.name_or_path}'",
                            f"model settings of '{base}' (the model= the adapter's run used)")


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
            from dpo_sweeps.rundir.paths import saved_model_path

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
    if peft_cfg.method == "qlora":
        from dpo_sweeps.models.quantize import check_quantizable

        check_quantizable(model, model_cfg.block_name)


def _check_modules_to_save(model: torch.nn.Module, peft_cfg: PeftConfig) -> None:
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    for name in peft_cfg.modules_to_save or ():
        if name not in leaves:
            raise InvalidConfig("peft.modules_to_save", f"{type(model).__name__} has no module named '{name}'",
                                "null, or names of its modules such as lm_head")


def start_adapter(model_cfg) -> Path | None:
    """The adapter folder model.init_from names (an earlier peft run's model/), or None."""
    from dpo_sweeps.rundir.paths import saved_model_path

    if model_cfg.init_from is None:
        return None
    folder = saved_model_path(model_cfg.init_from)
    return folder if is_adapter_folder(folder) else None
