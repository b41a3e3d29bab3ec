"""The one validation pass every run and every sweep point goes through before any process starts.

`validate_config` holds every check that needs only the config: ranges, choices and the rules
between keys (types and key names are the schema's, refused while the config is composed: schema.py).
It is cheap (no data or model is loaded), so a sweep checks every point before launching one job
(launchers/preflight.py). What needs the data, the model or the job's node is checked where they
are loaded, still before the first training step: the batch size against the pairs loaded
(train/trainer.py), columns and splits of the source (data/sources.py), the model's LM head and
attention (`check_chunked_logps_support(model)`, dpo/response_logps.py), the tokenizer a pretrained
model brings (models/build.py), and `check_fsdp_config` again with the device the node has.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from dpo_sweeps.config.schema import FAULT_KINDS
from dpo_sweeps.data.encoding import TRUNCATION_MODES, chat_template_setting, check_lengths, no_chat_template
from dpo_sweeps.data.sources import DATA_SOURCES, check_eval_size, looks_local
from dpo_sweeps.dpo.losses import check_loss_config
from dpo_sweeps.errors import DataError, InvalidConfig
from dpo_sweeps.models.gguf import resolve_gguf_file
from dpo_sweeps.parallel.plan import check_fsdp_config, resolve_plan
from dpo_sweeps.train.tracking import check_wandb_config

DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("adamw", "rmsprop")
TOKENIZER_KINDS = ("byte", "bpe", "pretrained")
# A BPE's vocabulary holds the 256 bytes and the special tokens before any merge.
MIN_BPE_VOCAB = 259


# Settings no check reads (any value is valid): a sweep's points that differ only in them are checked once.
NOT_CHECKED = {"train": ("seed", "progress_bar", "save_model")}


def validation_key(task_config: dict) -> str:
    """What `validate_config` of a resolved config depends on, as a string: equal keys, equal verdicts
    (for one base_dir, while the files it names stay as they are)."""
    import json

    kept = {section: {k: v for k, v in value.items() if k not in NOT_CHECKED[section]}
            if section in NOT_CHECKED and isinstance(value, dict) else value
            for section, value in task_config.items()}
    return json.dumps(kept, sort_keys=True, default=str)


def world_size_of(cfg: DictConfig) -> int:
    return int(cfg.resources.nodes) * int(cfg.resources.nproc_per_node)


def _at_least(value, minimum: int, setting: str, accepted: str | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidConfig(setting, f"got {value!r}", accepted or f"an integer >= {minimum}")


def _positive_number(value, setting: str, accepted: str) -> None:
    """A number > 0, or null."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        shown = int(value) if isinstance(value, float) and value.is_integer() else value  # the schema made 0 0.0
        raise InvalidConfig(setting, f"got {shown!r}", accepted)


def validate_config(cfg: DictConfig, base_dir: Path) -> None:
    """Raise InvalidConfig / DataError for the first setting that cannot work, or that leaves nothing to
    learn. (A run's command line, and a grid sweep's, is also checked for settings no config would read: unused.py.)"""
    _check_resources(cfg)
    _check_train(cfg)
    check_loss_config(cfg.loss)
    _check_something_to_learn(cfg)
    # auto is decided on the job's node (a sweep may be launched from a machine without the GPUs).
    device = cfg.resources.device
    check_fsdp_config(cfg.fsdp, world_size_of(cfg), cfg.resources.nproc_per_node, None if device == "auto" else device)
    resolve_plan(cfg)  # the parallel plan's own refusals: the mesh, the dtypes
    _check_loss_scaling(cfg.precision)
    _check_data(cfg.data, base_dir)
    _check_model(cfg.model)
    _check_chat_template(cfg.data.chat_template, cfg.model)
    _check_probe_and_checkpoints(cfg)
    check_wandb_config(cfg.wandb)
    if cfg.faults.kind is not None and cfg.faults.kind not in FAULT_KINDS:
        raise InvalidConfig("faults.kind", f"unknown fault '{cfg.faults.kind}'", f"null, {', '.join(FAULT_KINDS)}")


def _check_something_to_learn(cfg: DictConfig) -> None:
    """Settings that are valid numbers but leave no preference to learn, refused as loss.beta=0 is
    (train.lr=0, train.max_steps=0 and loss.beta=0 are refused by their own ranges)."""
    if cfg.loss.name == "mix" and all(term["weight"] == 0 for term in cfg.loss.terms):
        raise InvalidConfig("loss.terms", "every weight is 0: there is no loss to learn from",
                            "at least one term with a weight > 0")
    if cfg.data.name == "synthetic":
        if cfg.data.noise == 0.5:
            raise InvalidConfig("data.noise", "0.5 draws chosen and rejected answers alike: nothing to learn",
                                "a number in [0, 0.5); 0 is easiest")
        _at_least(cfg.data.response_letters, 1, "data.response_letters",
                  "an integer >= 1 (with no letters chosen and rejected are the same empty answer)")
        _at_least(cfg.data.prompt_letters, 0, "data.prompt_letters")


def _check_resources(cfg: DictConfig) -> None:
    res = cfg.resources
    _at_least(res.nodes, 1, "resources.nodes")
    _at_least(res.nproc_per_node, 1, "resources.nproc_per_node")
    if res.device not in DEVICES:
        raise InvalidConfig("resources.device", f"got {res.device!r}", ", ".join(DEVICES))
    _positive_number(res.device_memory_gib, "resources.device_memory_gib",
                     "a number of GiB > 0, or null (the CUDA device's memory; no check on CPU)")
    _positive_number(res.collective_timeout_s, "resources.collective_timeout_s", "a number of seconds > 0")
    _positive_number(res.hang_timeout_s, "resources.hang_timeout_s",
                     "a number of seconds > 0, or null for resources.collective_timeout_s")
    if res.threads_per_rank is not None:
        _at_least(res.threads_per_rank, 1, "resources.threads_per_rank", "an integer >= 1, or null")


def _check_train(cfg: DictConfig) -> None:
    train, world = cfg.train, world_size_of(cfg)
    _at_least(train.batch_size, 1, "train.batch_size")
    _at_least(train.micro_batch_size, 1, "train.micro_batch_size")
    batch, micro = train.batch_size, train.micro_batch_size
    if batch % (micro * world):
        raise InvalidConfig(
            "train.batch_size",
            f"{batch} is not a multiple of train.micro_batch_size ({micro}) x ranks ({world})",
            f"a multiple of {micro * world}, e.g. {micro * world * max(1, round(batch / (micro * world)))}",
        )
    _at_least(train.max_steps, 1, "train.max_steps")
    _positive_number(train.lr, "train.lr", "a number > 0")
    if train.optimizer not in OPTIMIZERS:
        raise InvalidConfig("train.optimizer", f"unknown optimizer '{train.optimizer}'", ", ".join(OPTIMIZERS))
    if train.weight_decay < 0:
        raise InvalidConfig("train.weight_decay", f"got {train.weight_decay!r}", "a number >= 0")
    _at_least(train.warmup_steps, 0, "train.warmup_steps")
    _at_least(train.eval_every, 0, "train.eval_every", "an integer >= 0 (0: only at the end)")
    if train.eval_max_pairs is not None:
        _at_least(train.eval_max_pairs, 1, "train.eval_max_pairs", "an integer >= 1, or null for all")
    _at_least(train.log_every, 1, "train.log_every")
    _at_least(train.sample_prompts, 0, "train.sample_prompts", "an integer >= 0 (0: no samples.json)")
    if train.sample_prompts:
        _at_least(train.sample_max_new_tokens, 1, "train.sample_max_new_tokens")
        if not train.save_model:
            raise InvalidConfig("train.sample_prompts", f"{train.sample_prompts} with train.save_model=false",
                                "0, or train.save_model=true (the replies after training come from the saved model)")
    _positive_number(train.max_grad_norm, "train.max_grad_norm", "a number > 0, or null for no clipping")
    _positive_number(train.time_limit_min, "train.time_limit_min", "a number of minutes > 0, or null for none")
    _at_least(train.logps_chunk_size, 0, "train.logps_chunk_size", "an integer >= 1, or 0 for full logits")
    if train.share_prompt and train.logps_chunk_size == 0:
        raise InvalidConfig("train.share_prompt", "true with train.logps_chunk_size=0",
                            "train.logps_chunk_size > 0 (prefix-shared batches are scored on response positions)")


def _check_loss_scaling(precision: DictConfig) -> None:
    if precision.loss_scaling:
        _positive_number(precision.initial_loss_scale, "precision.initial_loss_scale", "a number > 0")
        _at_least(precision.loss_scale_growth_interval, 1, "precision.loss_scale_growth_interval")


def _check_data(data: DictConfig, base_dir: Path) -> None:
    check_lengths(data.max_length, data.max_prompt_length)
    if data.truncation_mode not in TRUNCATION_MODES:
        raise InvalidConfig("data.truncation_mode", f"got {data.truncation_mode!r}", ", ".join(TRUNCATION_MODES))
    if data.length_grouped:
        _at_least(data.length_group_window, 1, "data.length_group_window", "an integer >= 1 (global batches per window)")
    if data.max_pairs is not None:
        _at_least(data.max_pairs, 1, "data.max_pairs", "an integer >= 1, or null for all")
    if data.name == "synthetic":
        for key in ("num_train_pairs", "num_eval_pairs", "num_topics"):
            _at_least(data[key], 1, f"data.{key}")
        if not 0.0 <= data.noise <= 0.5:
            raise InvalidConfig("data.noise", f"got {data.noise}", "a number in [0, 0.5); 0 is easiest")
        return
    if not data.path:
        raise InvalidConfig("data.path", "not set", DATA_SOURCES)
    check_eval_size(data.eval_size)
    local = Path(str(data.path)).expanduser()
    local = local if local.is_absolute() else base_dir / local
    if not local.exists() and looks_local(str(data.path)):
        raise DataError(f"data.path: no such file or folder '{data.path}' (resolved to {local}; accepted: {DATA_SOURCES})")


def _check_model(model: DictConfig) -> None:
    if model.block_name in (None, ""):
        raise InvalidConfig("model.block_name", "not set", "the transformer block class FSDP wraps, e.g. GPT2Block")
    kind = model.tokenizer.kind
    if kind not in TOKENIZER_KINDS:
        raise InvalidConfig("model.tokenizer.kind", f"unknown kind '{kind}'", ", ".join(TOKENIZER_KINDS))
    if kind == "bpe":
        _at_least(model.tokenizer.vocab_size, MIN_BPE_VOCAB, "model.tokenizer.vocab_size",
                  f"an integer >= {MIN_BPE_VOCAB} for kind=bpe")
    if model.gguf_file is not None:
        if model.from_config is not None:
            raise InvalidConfig("model.from_config", "set together with model.gguf_file",
                                "null with model.gguf_file (the GGUF file holds the architecture)")
        if kind != "pretrained":
            raise InvalidConfig("model.tokenizer.kind", f"{kind} with model.gguf_file",
                                "pretrained (the GGUF file's own tokenizer)")
        resolve_gguf_file(model.gguf_file, model.install_hint)


def _check_chat_template(setting, model: DictConfig) -> None:
    built = model.init_from is None and model.gguf_file is None and model.tokenizer.kind in ("byte", "bpe")
    if chat_template_setting(setting) == "true" and built:  # a tokenizer dpo-sweeps builds has none
        raise no_chat_template(f"model.tokenizer.kind={model.tokenizer.kind}")


def _check_probe_and_checkpoints(cfg: DictConfig) -> None:
    _at_least(cfg.perf.warmup_steps, 0, "perf.warmup_steps")
    steps, warmup = cfg.probe.steps, cfg.perf.warmup_steps
    _at_least(steps, 0, "probe.steps", "0 (a normal run) or the number of steps to probe")
    if 0 < steps <= warmup:
        raise InvalidConfig("probe.steps", f"{steps} leaves no timed step after perf.warmup_steps={warmup}",
                            f"an integer > {warmup} (e.g. {warmup + 5})")
    _at_least(cfg.checkpoint.every_steps, 0, "checkpoint.every_steps", "an integer >= 0 (0: no periodic checkpoints)")
    if cfg.checkpoint.keep_last is not None:
        _at_least(cfg.checkpoint.keep_last, 1, "checkpoint.keep_last", "an integer >= 1, or null to keep all")
