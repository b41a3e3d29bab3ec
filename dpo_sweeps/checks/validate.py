"""The one validation pass every run and every sweep point goes through before any process starts.

`validate_config` runs every check that needs only the config: each section's own (`Config.check`:
the ranges and choices of its fields, beside them in schema.py, data_schema.py and dpo/losses/schema.py)
and, here, the rules between sections and what the config names outside itself (types and key names
are the schema's, refused while the config is composed). It is cheap (no data or model is loaded), so a
sweep checks every point before launching one job (launchers/preflight.py). What needs the data, the
model or the job's node is checked where they are loaded, still before the first training step: the
batch size against the pairs loaded (train/setup.py), columns and splits of the source
(data/sources.py), the model's LM head and attention (`check_chunked_logps_support(model)`,
dpo/response_logps.py), the tokenizer a pretrained model brings (models/build.py), and
`check_fsdp_config` again with the device the node has.
A credential inside a setting (dpo_sweeps/redaction.py's rule 2) is refused first: every file of the run
would carry it, and no setting needs one (the services' clients read theirs from the environment).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dpo_sweeps.config.data_schema import DataConfig, chat_template_setting
from dpo_sweeps.config.schema import Config, ModelConfig
from dpo_sweeps.config.section import refuse
from dpo_sweeps.data.encoding import no_chat_template
from dpo_sweeps.data.rows import longest_rows
from dpo_sweeps.data.sources import DATA_SOURCES, looks_local
from dpo_sweeps.errors import DataError, InvalidConfig
from dpo_sweeps.models.gguf import resolve_gguf_file
from dpo_sweeps.parallel.allocator import missing_allocator
from dpo_sweeps.parallel.plan import check_fsdp_config, resolve_plan
from dpo_sweeps.redaction import secrets_in_text
from dpo_sweeps.tracking.mlflow_uri import MLFLOW_URI_ACCEPTED, mlflow_uri_problem

# Settings no check reads (any value is valid): a sweep's points that differ only in them are checked once.
# (train.save_model is read: train.sample_prompts needs it.)
NOT_CHECKED = {"train": ("seed", "progress_bar")}


def validation_key(task_config: dict) -> str:
    """What `validate_config` of a resolved config depends on, as a string: equal keys, equal verdicts
    (for one base_dir, while the files it names stay as they are)."""
    kept = {section: {k: v for k, v in value.items() if k not in NOT_CHECKED[section]}
            if section in NOT_CHECKED and isinstance(value, dict) else value
            for section, value in task_config.items()}
    return json.dumps(kept, sort_keys=True, default=str)


def validate_config(cfg: Config, base_dir: Path) -> None:
    """Raise InvalidConfig / DataError for the first setting that cannot work, or that leaves nothing to
    learn: each section's own checks, then those between sections. (A run's command line, and a grid
    sweep's, is also checked for settings no config would read: unused.py.)"""
    _check_no_credentials(cfg)
    cfg.check()
    _check_cluster_size(cfg)  # before the batch split: more ranks than the cluster has is the first fault
    _check_batch_split(cfg)
    _check_row_budget(cfg)
    # auto is decided on the job's node (a sweep may be launched from a machine without the GPUs).
    device = cfg.resources.device
    check_fsdp_config(cfg.fsdp, cfg.world_size, cfg.resources.nproc_per_node, None if device == "auto" else device)
    resolve_plan(cfg)  # the parallel plan's own refusals: the mesh, the dtypes
    _check_data_path(cfg.data, base_dir)
    if cfg.model.gguf_file is not None:
        resolve_gguf_file(cfg.model.gguf_file, cfg.model.install_hint)
    _check_chat_template(cfg.data.chat_template, cfg.model)
    _check_probe(cfg)
    _check_trackers(cfg)
    _check_peft(cfg)
    if cfg.train.compile:  # what torch.compile needs here; a rank checks its own node again (parallel/fsdp.py)
        from dpo_sweeps.parallel.compile import check_compile_support  # imports torch._inductor: only when asked

        check_compile_support(cfg.resources.device, on_device=False)
    if problem := missing_allocator(cfg.resources.cpu_allocator):
        refuse("resources.cpu_allocator", f"{cfg.resources.cpu_allocator}: {problem}",
               "auto (the default: tcmalloc where it is installed) or glibc")


def _check_no_credentials(cfg: Config) -> None:
    """No setting's value holds a password, token or key (the refusal names the setting, never the value)."""
    for setting, value in _string_settings(cfg, ""):
        if secrets_in_text(value):
            mlflow = setting.startswith("tracking.mlflow.")
            refuse(setting, (mlflow_uri_problem(value) if mlflow else None) or "holds a credential (a URI's "
                   "password, a token or key parameter, an Authorization value), which the run's files and "
                   "trackers would carry", MLFLOW_URI_ACCEPTED if mlflow else
                   "the value without it; credentials are read from the environment variables of the service "
                   "that needs them (WANDB_API_KEY, HF_TOKEN, MLFLOW_TRACKING_PASSWORD, ...)")


def _string_settings(node: Any, prefix: str) -> Iterator[tuple[str, str]]:
    """(dotted setting, value) for every string in a typed config, lists and mappings included."""
    if dataclasses.is_dataclass(node):
        items = ((f.name, getattr(node, f.name)) for f in dataclasses.fields(node))
    elif isinstance(node, Mapping):
        items = node.items()
    elif isinstance(node, (list, tuple)):
        items = ((f"[{i}]", v) for i, v in enumerate(node))
    else:
        if isinstance(node, str):
            yield prefix, node
        return
    for name, value in items:
        yield from _string_settings(value, f"{prefix}{name}" if str(name).startswith("[") or not prefix
                                    else f"{prefix}.{name}")


def _check_batch_split(cfg: Config) -> None:
    """train.batch_size splits into micro-batches over the ranks (resources)."""
    batch, micro, world = cfg.train.batch_size, cfg.train.micro_batch_size, cfg.world_size
    if batch % (micro * world):
        raise InvalidConfig(
            "train.batch_size",
            f"{batch} is not a multiple of train.micro_batch_size ({micro}) x ranks ({world})",
            f"a multiple of {micro * world}, e.g. {micro * world * max(1, round(batch / (micro * world)))}",
        )


def _check_row_budget(cfg: Config) -> None:
    """train.micro_batch_tokens takes the widest row one pair can take at the data limits (data/rows.py):
    packing never splits a pair. (A prefix-shared pair with a short prompt can be wider still; the pairs
    loaded are checked against it in train/setup.py.)"""
    budget = cfg.train.micro_batch_tokens
    if not cfg.train.packing or budget is None:
        return
    widest = longest_rows(1, cfg.data.max_length, cfg.data.max_prompt_length,
                          share_prompt=cfg.train.share_prompt).length
    if budget < widest:
        row = ("the prompt and both responses at data.max_prompt_length and data.max_length"
               if cfg.train.share_prompt else "data.max_length")
        refuse("train.micro_batch_tokens", f"{budget} with train.packing=true is narrower than the widest row one "
               f"pair can take ({widest} tokens: {row}); packing never splits a pair",
               f"an integer >= {widest}, or null")


def _check_cluster_size(cfg: Config) -> None:
    """resources.nodes and nproc_per_node fit in the cluster the config names (cluster=)."""
    cluster = cfg.cluster
    if cluster is None:
        return
    if cfg.resources.nproc_per_node > cluster.gpus_per_node:
        raise InvalidConfig("resources.nproc_per_node", f"{cfg.resources.nproc_per_node} on cluster={cluster.name}, "
                            f"whose nodes have {cluster.gpus_per_node} devices", f"an integer <= {cluster.gpus_per_node}")
    if cluster.max_nodes is not None and cfg.resources.nodes > cluster.max_nodes:
        raise InvalidConfig("resources.nodes", f"{cfg.resources.nodes} on cluster={cluster.name}, which has "
                            f"{cluster.max_nodes}", f"an integer <= {cluster.max_nodes}")


def _check_data_path(data: DataConfig, base_dir: Path) -> None:
    """data.path names a source, and a local one is there (relative to the directory the command ran in)."""
    if data.name == "synthetic":
        return
    if not data.path:
        raise InvalidConfig("data.path", "not set", DATA_SOURCES)
    local = Path(str(data.path)).expanduser()
    local = local if local.is_absolute() else base_dir / local
    if not local.exists() and looks_local(str(data.path)):
        raise DataError(f"data.path: no such file or folder '{data.path}' (resolved to {local}; accepted: {DATA_SOURCES})")


def _check_chat_template(setting, model: ModelConfig) -> None:
    built = model.init_from is None and model.gguf_file is None and model.tokenizer.kind in ("byte", "bpe")
    if chat_template_setting(setting) == "true" and built:  # a tokenizer dpo-sweeps builds has none
        raise no_chat_template(f"model.tokenizer.kind={model.tokenizer.kind}")


def _check_probe(cfg: Config) -> None:
    steps, warmup = cfg.probe.steps, cfg.perf.warmup_steps
    if 0 < steps <= warmup:
        raise InvalidConfig("probe.steps", f"{steps} leaves no timed step after perf.warmup_steps={warmup}",
                            f"an integer > {warmup} (e.g. {warmup + 5})")


def _check_trackers(cfg: Config) -> None:
    """Each chosen tracker's library is installed, and MLflow has a tracking URI (its setting or
    MLFLOW_TRACKING_URI) that is one."""
    from dpo_sweeps.tracking.backend import missing_libraries

    for name, known in missing_libraries(list(cfg.tracking.backends)):
        if name != "wandb" or cfg.tracking.wandb.mode != "disabled":
            refuse("tracking.backends", f"names {name}, whose library {known.library} is not installed",
                   f"`{known.pip}`, or tracking.backends without {name}")
    if "mlflow" not in cfg.tracking.backends:
        return
    if (uri := cfg.tracking.mlflow.tracking_uri) is not None:
        if problem := mlflow_uri_problem(uri):
            refuse("tracking.mlflow.tracking_uri", problem, MLFLOW_URI_ACCEPTED)
    else:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            refuse("tracking.mlflow.tracking_uri", "not set, nor MLFLOW_TRACKING_URI",
                   "the URI of an MLflow server (http://host:5000), file:/path or sqlite:///path.db")
        if problem := mlflow_uri_problem(uri):
            refuse("MLFLOW_TRACKING_URI", problem.replace(uri, "<the variable's value>"), MLFLOW_URI_ACCEPTED)
def _check_peft(cfg: Config) -> None:
    """Adapters: the modules they name exist in the model, an adapter to start from is whole and for this
    base (models/adapters.py), and nothing reads model/ as a full model."""
    if cfg.peft.method == "none" and cfg.model.init_from is None:
        return  # nothing to check, and a sweep's check before launch loads no torch (models/adapters.py does)
    from dpo_sweeps.models.adapters import check_adapter_targets, check_start_adapter, start_adapter

    start = start_adapter(cfg.model)
    if start is not None:
        check_start_adapter(start, cfg.model.init_from, cfg.model, cfg.peft)
    if cfg.peft.method == "none":
        return
    if cfg.train.sample_prompts:
        raise InvalidConfig("train.sample_prompts", f"{cfg.train.sample_prompts} with peft={cfg.peft.method} "
                            "(the replies are generated from a full saved model; model/ holds adapters)",
                            "0 with peft (or peft=none)")
    if start is None:  # a started adapter keeps its own targets
        check_adapter_targets(cfg.model, cfg.peft)
    if cfg.peft.method == "qlora":
        _check_qlora(cfg)


def _check_qlora(cfg: Config) -> None:
    """peft=qlora where bitsandbytes' 4-bit layers run and give the numbers they should (docs/lora.md)."""
    from dpo_sweeps.models.quantize import bitsandbytes_problem

    if problem := bitsandbytes_problem():
        refuse("peft", f"qlora: {problem}", "peft=lora (the base in full precision)")
    param_dtype = resolve_plan(cfg).param_dtype
    storage = cfg.peft.bnb_4bit_quant_storage
    if storage is not None and storage != param_dtype:
        refuse("peft.bnb_4bit_quant_storage", f"{storage} with precision={cfg.precision.name} (param_dtype "
               f"{param_dtype}): FSDP2 would cast the packed 4-bit weights", f"null or {param_dtype}")
    if cfg.train.save_merged:
        refuse("train.save_merged", "true with peft=qlora (the base is 4-bit: merging would dequantize it)",
               "false; model/ holds the adapter, which PeftModel.from_pretrained loads onto the base")
