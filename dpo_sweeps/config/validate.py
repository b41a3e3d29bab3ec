"""Checks a config must pass before any process starts: each failure names the setting and what is accepted.

`validate_config` is cheap (no data or model is loaded), so a sweep can check every grid point
before launching one job. Data columns and model names are checked when the run loads them,
still before the first training step.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from dpo_sweeps.data.encoding import TRUNCATION_MODES, check_lengths
from dpo_sweeps.data.sources import DATA_SOURCES, check_eval_size, looks_local
from dpo_sweeps.dpo.losses import check_loss_config
from dpo_sweeps.errors import DataError, InvalidConfig
from dpo_sweeps.parallel.fsdp import check_fsdp_config, dtype_of
from dpo_sweeps.train.faults import FAULT_KINDS
from dpo_sweeps.train.tracking import check_wandb_config

DEVICES = ("auto", "cpu", "cuda")


def world_size_of(cfg: DictConfig) -> int:
    return int(cfg.resources.nodes) * int(cfg.resources.nproc_per_node)


def _positive_int(value, setting: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidConfig(setting, f"got {value!r}", "an integer >= 1")
    return value


def validate_config(cfg: DictConfig, base_dir: Path) -> None:
    """Raise InvalidConfig / DataError for the first setting that cannot work."""
    res, train = cfg.resources, cfg.train
    nodes = _positive_int(res.nodes, "resources.nodes")
    nproc = _positive_int(res.nproc_per_node, "resources.nproc_per_node")
    world = nodes * nproc
    if res.device not in DEVICES:
        raise InvalidConfig("resources.device", f"got {res.device!r}", ", ".join(DEVICES))
    limit = res.device_memory_gib
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
        raise InvalidConfig("resources.device_memory_gib", f"got {limit!r}",
                            "a number of GiB > 0, or null (the CUDA device's memory; no check on CPU)")
    hang = res.hang_timeout_s
    if hang is not None and (isinstance(hang, bool) or not isinstance(hang, (int, float)) or hang <= 0):
        raise InvalidConfig("resources.hang_timeout_s", f"got {hang!r}",
                            "a number of seconds > 0, or null for resources.collective_timeout_s")

    batch = _positive_int(train.batch_size, "train.batch_size")
    micro = _positive_int(train.micro_batch_size, "train.micro_batch_size")
    if batch % (micro * world):
        raise InvalidConfig(
            "train.batch_size",
            f"{batch} is not a multiple of train.micro_batch_size ({micro}) x ranks ({world})",
            f"a multiple of {micro * world}, e.g. {micro * world * max(1, round(batch / (micro * world)))}",
        )
    _positive_int(train.max_steps, "train.max_steps")
    if not isinstance(train.lr, (int, float)) or train.lr <= 0:
        raise InvalidConfig("train.lr", f"got {train.lr!r}", "a number > 0")
    if train.optimizer not in ("adamw", "rmsprop"):
        raise InvalidConfig("train.optimizer", f"unknown optimizer '{train.optimizer}'", "adamw, rmsprop")
    if not isinstance(train.warmup_steps, int) or train.warmup_steps < 0:
        raise InvalidConfig("train.warmup_steps", f"got {train.warmup_steps!r}", "an integer >= 0")
    if train.eval_every is not None and (not isinstance(train.eval_every, int) or train.eval_every < 0):
        raise InvalidConfig("train.eval_every", f"got {train.eval_every!r}", "an integer >= 0 (0: only at the end)")
    if train.max_grad_norm is not None and train.max_grad_norm <= 0:
        raise InvalidConfig("train.max_grad_norm", f"got {train.max_grad_norm!r}", "a number > 0, or null for no clipping")

    check_loss_config(cfg.loss)
    # auto is decided on the job's node (a sweep may be launched from a machine without the GPUs).
    check_fsdp_config(cfg.fsdp, world, nproc, None if res.device == "auto" else res.device)
    for key in ("param_dtype", "reduce_dtype"):
        dtype_of(cfg.precision[key], f"precision.{key}")

    data = cfg.data
    check_lengths(data.max_length, data.max_prompt_length)
    if data.truncation_mode not in TRUNCATION_MODES:
        raise InvalidConfig("data.truncation_mode", f"got {data.truncation_mode!r}", ", ".join(TRUNCATION_MODES))
    if data.name != "synthetic":
        if not data.path:
            raise InvalidConfig("data.path", "not set", DATA_SOURCES)
        check_eval_size(data.eval_size)
        local = Path(str(data.path)).expanduser()
        local = local if local.is_absolute() else base_dir / local
        if not local.exists() and looks_local(str(data.path)):
            raise DataError(f"data.path: no such file or folder '{data.path}' (resolved to {local}; accepted: {DATA_SOURCES})")

    if cfg.model.block_name in (None, ""):
        raise InvalidConfig("model.block_name", "not set", "the transformer block class FSDP wraps, e.g. GPT2Block")
    check_wandb_config(cfg.wandb)
    if cfg.faults.kind is not None and cfg.faults.kind not in FAULT_KINDS:
        raise InvalidConfig("faults.kind", f"unknown fault '{cfg.faults.kind}'", f"null, {', '.join(FAULT_KINDS)}")
