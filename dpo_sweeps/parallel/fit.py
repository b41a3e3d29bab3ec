"""Will a config fit its device? The memory estimate from the config alone, before anything launches.

A sweep compares every point's estimated peak (memory_estimate.py) with `resources.device_memory_gib`
and does not start the points that would not fit (launchers/preflight.py). Before launch there is no
data and no model, so the estimate here takes:
- the architecture from the model config, built on the `meta` device (no weights, no memory), with the
  tokenizer's vocabulary: the byte tokenizer's, `model.tokenizer.vocab_size` for a BPE still to be
  trained, or the saved or named model's own config;
- `data.max_length` as every row's length (runs pad to their longest row, which is at most that);
- on a CPU, a rank's resident memory before its model exists, measured once in a fresh Python
  process that imports what a rank imports (`rank_baseline_bytes`; this process, with Hydra, the
  sweeper and meta-device models loaded, is larger). A rank also holds its data, which is not
  counted here (the sweep has not read it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dpo_sweeps.parallel.gpu_driver import gpu_driver_present
from dpo_sweeps.parallel.memory_estimate import GIB, ModelShape, estimate_peak_memory, run_shape_of
from dpo_sweeps.parallel.plan import resolve_plan


@dataclass(frozen=True)
class FitCheck:
    estimate_gib: float
    limit_gib: float

    @property
    def fits(self) -> bool:
        return self.estimate_gib <= self.limit_gib

    def message(self) -> str:
        return (f"estimated peak {self.estimate_gib:.2f} GiB per device exceeds resources.device_memory_gib "
                f"{self.limit_gib:.2f} GiB; not started (hydra.sweeper.skip_predicted_oom=false runs it anyway)")


def device_memory_limit_gib(cfg) -> float | None:
    """`resources.device_memory_gib`, or the memory of this machine's first CUDA device when the run
    will use CUDA; None (no check) on a CPU or where no GPU is visible to the sweep."""
    if cfg.resources.device_memory_gib is not None:
        return float(cfg.resources.device_memory_gib)
    if cfg.resources.device == "cpu" or not gpu_driver_present():  # no GPU: no check, and no torch to load
        return None
    from dpo_sweeps.parallel.distributed import wants_cuda

    if wants_cuda(cfg.resources.device):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / GIB
    return None


def predicted_peak_gib(cfg, world_size: int) -> float:
    """The estimated peak memory per device of a resolved config, in GiB."""
    from dpo_sweeps.parallel.distributed import wants_cuda

    shape = _model_shape(_architecture_key(cfg.model))
    baseline = 0 if wants_cuda(cfg.resources.device) else rank_baseline_bytes()
    plan = resolve_plan(cfg, world_size)
    return estimate_peak_memory(shape, run_shape_of(cfg, plan), baseline_bytes=baseline).total / GIB


def check_fit(cfg, world_size: int) -> FitCheck | None:
    """The fit check of one config (None when there is no limit to check against)."""
    limit = device_memory_limit_gib(cfg)
    if limit is None:
        return None
    return FitCheck(predicted_peak_gib(cfg, world_size), limit)


RANK_IMPORTS = "dpo_sweeps.runtime.rank"  # the module a rank process runs (and all it imports)


@lru_cache(maxsize=1)
def rank_baseline_bytes() -> int:
    """The resident memory of a fresh Python process once it has imported what a rank imports: a CPU
    rank's memory before its data and model. Falls back to this process's (larger: the safe side)
    where that process cannot be run."""
    import subprocess
    import sys

    from dpo_sweeps.train.perf import resident_bytes

    code = f"import {RANK_IMPORTS}; from dpo_sweeps.train.perf import resident_bytes; print(resident_bytes())"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
        return int(out.stdout.split()[-1]) or resident_bytes()
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return resident_bytes()


def _architecture_key(model_cfg) -> tuple:
    """What decides the architecture, hashable (sweep points often share their model)."""
    import json

    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(model_cfg.from_config, resolve=True) if model_cfg.from_config is not None else None
    return (model_cfg.init_from, model_cfg.name_or_path, json.dumps(spec, sort_keys=True),
            model_cfg.tokenizer.kind, model_cfg.tokenizer.vocab_size, model_cfg.gguf_file)


@lru_cache(maxsize=64)
def _model_shape(key: tuple) -> ModelShape:
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    init_from, name_or_path, spec_json, tokenizer_kind, vocab_size, gguf_file = key
    if init_from is not None:
        from dpo_sweeps.models.build import saved_model_path

        config = AutoConfig.from_pretrained(saved_model_path(init_from))
    elif spec_json != "null":
        spec = json.loads(spec_json)
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
        if tokenizer_kind == "byte":
            from dpo_sweeps.models.tokenizers import byte_tokenizer

            config.vocab_size = len(byte_tokenizer())
        elif tokenizer_kind == "bpe" and vocab_size:
            config.vocab_size = int(vocab_size)  # an upper bound: a BPE trained on little text has fewer
    elif gguf_file is not None:
        from dpo_sweeps.models.gguf import plain_config, resolve_gguf_file

        config = plain_config(resolve_gguf_file(gguf_file))  # the file's metadata only
    else:
        config = AutoConfig.from_pretrained(name_or_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return ModelShape.of(model)
