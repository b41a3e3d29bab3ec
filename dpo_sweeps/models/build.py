"""Policy and reference models, and their tokenizer.

A model config either names a model (`model.name_or_path`, loaded with `from_pretrained`; local
folders work offline), a GGUF file (`model.gguf_file`, dequantized once and cached: models/gguf.py)
or describes a random-init architecture (`model.from_config`, a transformers config).
`model.init_from` points at an earlier run's directory: its saved model starts the policy and is the
reference (SFT then DPO); when it saved adapters (peft), the base is built as above and the adapter
loaded onto it (models/adapters.py).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from dpo_sweeps.config.schema import ModelConfig
from dpo_sweeps.errors import DiskFull, InvalidConfig, is_disk_full
from dpo_sweeps.models import adapters, gguf
from dpo_sweeps.models.tokenizers import bpe_tokenizer, byte_tokenizer
from dpo_sweeps.rundir.paths import MERGED_MODEL_DIR, saved_model_path, writing

MODEL_SOURCES = ("a preset in conf/model/, a local folder with config.json, a hub name in the local cache, "
                 "or model.gguf_file")



def save_model(policy: torch.nn.Module, tokenizer, run_dir: Path, is_main: bool, *, base_name: str = "",
               merged: bool = False) -> Path | None:
    """The policy in Hugging Face format (full state dict gathered to rank 0), with its tokenizer (collective).

    A policy with adapters (peft) is saved as a PEFT adapter folder for `base_name`, the adapter weights
    gathered from every rank; `merged` also writes the merged model, in Hugging Face format, to model_merged/.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    path = saved_model_path(run_dir)
    if is_main:
        try:  # safetensors and tokenizers raise their own types: `writing` names the path (or the file)
            if adapters.has_adapters(policy):
                with writing(path):
                    adapters.save_adapter(policy, state, path, base_name)
                    tokenizer.save_pretrained(path)
                if merged:
                    merged_path = path.with_name(MERGED_MODEL_DIR)
                    with writing(merged_path):
                        adapters.merged_model(policy, state).save_pretrained(merged_path)
                        tokenizer.save_pretrained(merged_path)
            else:
                with torch.device("meta"):
                    plain = AutoModelForCausalLM.from_config(policy.config)
                plain.load_state_dict(state, assign=True)
                plain.tie_weights()  # assign= gave tied weights (e.g. embeddings and LM head) a tensor each: one again
                with writing(path):
                    plain.save_pretrained(path)
                    tokenizer.save_pretrained(path)
        except Exception as exc:
            if not is_disk_full(exc, path.parent):
                raise
            shutil.rmtree(path, ignore_errors=True)  # half a model is no model
            raise DiskFull(f"no space left on device writing the final model to {path}") from exc
    if dist.is_initialized():
        dist.barrier()
    return path if is_main else None


def _init_source(model_cfg: ModelConfig) -> Path | None:
    if model_cfg.init_from is None:
        return None
    path = saved_model_path(model_cfg.init_from)
    if adapters.is_adapter_folder(path):  # the base is built as model.* says; add_adapters loads the adapter
        return None
    if not (path / "config.json").exists():
        raise InvalidConfig(
            "model.init_from",
            f"no saved model in '{model_cfg.init_from}' (looked for {path}/config.json)",
            "the directory of a completed run, which holds model/",
        )
    return path


def build_tokenizer(model_cfg: ModelConfig, training_texts: list[str]) -> PreTrainedTokenizerBase:
    """The run's tokenizer; a BPE is trained on `training_texts` (and cached)."""
    source = _init_source(model_cfg) or adapters.start_adapter(model_cfg)  # an adapter folder holds it too
    if source is not None:
        return AutoTokenizer.from_pretrained(source)
    if model_cfg.gguf_file is not None:
        tokenizer = _gguf_tokenizer(model_cfg)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
    kind = model_cfg.tokenizer.kind
    if kind == "byte":
        return byte_tokenizer()
    if kind == "bpe":  # kind and vocab_size were checked by checks/validate.py
        return bpe_tokenizer(training_texts, model_cfg.tokenizer.vocab_size)
    try:  # pretrained
        tokenizer = AutoTokenizer.from_pretrained(model_cfg.name_or_path)
    except (OSError, ValueError) as exc:
        raise InvalidConfig(
            "model.name_or_path",
            f"cannot load a tokenizer for '{model_cfg.name_or_path}' ({_first_line(exc)})",
            MODEL_SOURCES,
        ) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token_id is None:
        raise InvalidConfig("model.name_or_path", "its tokenizer has no EOS token", "a tokenizer with eos_token")
    return tokenizer


def _gguf_source(model_cfg: ModelConfig) -> tuple[Path, Path | None]:
    """The GGUF file and its cache folder (None: the cache cannot be written); fills the cache once."""
    path = gguf.resolve_gguf_file(model_cfg.gguf_file, model_cfg.install_hint)
    return path, gguf.cached_folder(path)


def _gguf_tokenizer(model_cfg: ModelConfig) -> PreTrainedTokenizerBase:
    path, folder = _gguf_source(model_cfg)
    return AutoTokenizer.from_pretrained(folder) if folder is not None else gguf.load_tokenizer(path)


def load_model_code(model_cfg: ModelConfig | None = None, *, adapters: bool = False) -> None:
    """Import the code that builds a model, before it is built: transformers' modeling_utils (which brings
    accelerate and the optional packages transformers finds installed), the architecture's own module when
    `model.from_config` names it, and peft for adapters. How much memory that code takes depends on what is
    installed beside dpo-sweeps, so a CPU rank reads its baseline for the memory estimate after it, not
    before (train/setup.py; parallel/fit.py's baseline process imports the same)."""
    import transformers.modeling_utils  # noqa: F401
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_type = (model_cfg.from_config or {}).get("model_type") if model_cfg is not None else None
    if model_type in CONFIG_MAPPING:
        config_class = CONFIG_MAPPING[model_type]
        if config_class in MODEL_FOR_CAUSAL_LM_MAPPING:
            MODEL_FOR_CAUSAL_LM_MAPPING[config_class]  # the lazy mapping imports the architecture's module
    if adapters:
        import peft  # noqa: F401


def build_policy(model_cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> torch.nn.Module:
    """The policy in fp32 on CPU (FSDP moves and casts it). Same seed, same weights on every rank."""
    source = _init_source(model_cfg)
    if source is not None:
        return AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    if model_cfg.gguf_file is not None:
        path, folder = _gguf_source(model_cfg)
        if folder is None:
            return gguf.load_model(path)
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if model_cfg.from_config is not None:
        spec = copy.deepcopy(model_cfg.from_config)
        model_type = spec.pop("model_type", None)
        try:
            config = AutoConfig.for_model(model_type, **spec)
        except ValueError as exc:
            raise InvalidConfig("model.from_config.model_type", _first_line(exc), "a transformers model_type such as gpt2, llama, gpt_neox") from None
        config.vocab_size = len(tokenizer)
        config.eos_token_id = tokenizer.eos_token_id
        config.bos_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    try:
        return AutoModelForCausalLM.from_pretrained(model_cfg.name_or_path, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise InvalidConfig(
            "model.name_or_path", f"cannot load '{model_cfg.name_or_path}' ({_first_line(exc)})", MODEL_SOURCES
        ) from None


def build_reference(policy: torch.nn.Module, param_dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of the policy as it starts (no grad, eval mode), its parameters in `param_dtype`.

    Only parameters are cast, as FSDP2's MixedPrecisionPolicy casts the policy's: buffers such as
    Llama's RoPE `inv_freq` stay fp32, so policy and reference compute the same numbers at step 0.
    """
    reference = copy.deepcopy(policy)
    reference.eval()
    reference.requires_grad_(False)
    for param in reference.parameters():
        param.data = param.data.to(param_dtype)
    return reference


def check_block_name(model: torch.nn.Module, block_name: str) -> list[torch.nn.Module]:
    """The transformer blocks FSDP wraps; a wrong name lists the block classes the model has."""
    blocks = [m for m in model.modules() if type(m).__name__ == block_name]
    if blocks:
        return blocks
    candidates = sorted(
        {
            type(child).__name__
            for module in model.modules()
            if isinstance(module, torch.nn.ModuleList)
            for child in module
        }
    )
    raise InvalidConfig(
        "model.block_name",
        f"{type(model).__name__} has no module of class '{block_name}'",
        ", ".join(candidates) or "none found",
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
