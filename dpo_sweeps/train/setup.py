"""What a Trainer trains with, built before its first step: the data, the tokenizer, the sharded
policy and reference, the optimizer, its schedule and the loss scaler.

The Trainer (train/trainer.py) calls `build_training` once in `setup()` and then only runs the loop
over the one record it returns (`TrainingSetup`); nothing here runs a training step.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from dpo_sweeps.config.schema import Config, TrainConfig
from dpo_sweeps.data.encoding import (
    EncodedPair,
    GlobalBatchSampler,
    eval_micro_batch_indices,
    pair_tokens,
)
from dpo_sweeps.data.packing import check_pairs_fit
from dpo_sweeps.data.row_checks import DroppedRows
from dpo_sweeps.data.sources import load_preference_rows
from dpo_sweeps.dpo.adapter_reference import AdapterReference
from dpo_sweeps.dpo.losses import uses_reference
from dpo_sweeps.errors import DataError
from dpo_sweeps.models.adapters import add_adapters, start_adapter
from dpo_sweeps.models.build import build_policy, build_reference, load_model_code
from dpo_sweeps.models.quantize import quantizable_params, quantize_base
from dpo_sweeps.parallel.allocator import allocator_in_use
from dpo_sweeps.parallel.distributed import rank_layout
from dpo_sweeps.parallel.fsdp import build_mesh, check_fsdp_config, shard_model
from dpo_sweeps.parallel.memory_estimate import ModelShape, eval_batching, run_shape_of
from dpo_sweeps.parallel.mfu import ModelFlops
from dpo_sweeps.parallel.plan import ParallelPlan, torch_dtype
from dpo_sweeps.parallel.precision import DynamicLossScaler, loss_scaler, mixed_precision_policy, slow_on_this_cpu
from dpo_sweeps.parallel.process_memory import release_freed_heap, resident_bytes
from dpo_sweeps.parallel.rank_env import RankEnv
from dpo_sweeps.runtime.shared_ranks import sharing
from dpo_sweeps.runtime.signals import StopRequests
from dpo_sweeps.tokenized import pair_tokenizer
from dpo_sweeps.train.perf import trained_before
from dpo_sweeps.train.reference_pass import free_reference, precompute_reference_logps

log = logging.getLogger(__name__)


@dataclass
class TrainingData:
    """The tokenized pairs and how the steps draw them."""

    tokenizer: Any
    train_pairs: list[EncodedPair]
    eval_pairs: list[EncodedPair]
    sampler: GlobalBatchSampler
    counts: dict[str, int]  # summary.json "data"
    end_of_turn: str | None  # the chat template's end-of-turn token, when pairs were rendered with one
    # For the memory estimate: the widest row, and the scored share of tokens.
    longest_row: int
    response_fraction: float


@dataclass
class Models:
    """Policy and reference (None when the loss needs none), sharded (or moved) onto this rank's device.
    With adapters (peft), the reference is the policy with its adapters switched off (models/adapters.py)."""

    policy: torch.nn.Module
    reference: torch.nn.Module | AdapterReference | None
    num_params: int
    model_flops: ModelFlops
    layout: dict  # summary.json: the mesh, the node of each rank, and the ranks' malloc
    shape: ModelShape  # for the memory estimate and the step-time prediction (counted before 4-bit packing)


@dataclass(frozen=True)
class _Encoded:
    tokenizer: Any
    train_pairs: list[EncodedPair]
    eval_pairs: list[EncodedPair]
    counts: dict[str, int]
    eval_source: str
    end_of_turn: str | None
    dropped: DroppedRows
    described: str


# The tokenized pairs of the previous run in this process, with what decided them: the runs of a probe
# batch (runtime/shared_ranks.py) run one after another in the same rank processes, most on the same data.
_previous: tuple[str, _Encoded] | None = None


def _encode(cfg: Config, base_dir: Path) -> _Encoded:
    """The run's pairs, tokenized; in a probe batch, the previous run's when made from the same settings."""
    global _previous
    if not sharing():
        _previous = None
        return _load_and_encode(cfg, base_dir)
    key = json.dumps({"data": asdict(cfg.data), "model": asdict(cfg.model),
                      "eval_max_pairs": cfg.train.eval_max_pairs, "base_dir": str(base_dir)},
                     sort_keys=True, default=str)
    if _previous is None or _previous[0] != key:
        _previous = None  # one set of pairs at a time
        _previous = (key, _load_and_encode(cfg, base_dir))
    return _previous[1]


def _load_and_encode(cfg: Config, base_dir: Path) -> _Encoded:
    rows = load_preference_rows(cfg.data, base_dir)
    tokenizing = pair_tokenizer(cfg, rows)
    dropped = DroppedRows()
    dropped.update(rows.dropped)
    train_pairs, train_truncated = tokenizing.encode(rows.train, rows.train_where, dropped)
    eval_max = cfg.train.eval_max_pairs or None
    eval_pairs, eval_truncated = tokenizing.encode(rows.eval[:eval_max], rows.eval_where[:eval_max], dropped)
    if not train_pairs or not eval_pairs:
        raise DataError(f"data.max_length: no {'training' if not train_pairs else 'held-out'} pairs of "
                        f"{rows.described} left once cut to {cfg.data.max_length} tokens; dropped: "
                        f"{dropped.describe_counts()} (accepted: a data.max_length that keeps chosen and rejected apart)")
    counts = {
        "train_pairs": len(train_pairs), "eval_pairs": len(eval_pairs),
        "train_truncated": train_truncated, "eval_truncated": eval_truncated, **rows.counts,
        "dropped_rows": dropped.counts(),
    }
    return _Encoded(tokenizing.tokenizer, train_pairs, eval_pairs, counts, str(rows.eval_source),
                    tokenizing.end_of_turn, dropped, rows.described)


def build_data(cfg: Config, base_dir: Path, env: RankEnv) -> TrainingData:
    share_prompt = cfg.train.share_prompt
    encoded = _encode(cfg, base_dir)
    tokenizer, train_pairs, eval_pairs, counts = encoded.tokenizer, encoded.train_pairs, encoded.eval_pairs, encoded.counts
    if env.is_main:
        log.info("data %s: %d train pairs (%d truncated), %d eval pairs from %s (%d truncated)",
                 cfg.data.name, len(train_pairs), counts["train_truncated"], len(eval_pairs),
                 encoded.eval_source, counts["eval_truncated"])
        for line in encoded.dropped.lines(encoded.described):
            log.warning("%s", line)
    if cfg.train.packing and cfg.train.micro_batch_tokens is not None:  # no pair wider than a packed row
        check_pairs_fit([*train_pairs, *eval_pairs], cfg.train.micro_batch_tokens, share_prompt=share_prompt)
    if len(train_pairs) < cfg.train.batch_size:
        raise DataError(f"train.batch_size: {cfg.train.batch_size} exceeds the {len(train_pairs)} "
                        f"training pairs of data.path (use a batch size <= {len(train_pairs)})")
    # Length-grouped sampling (data.length_grouped): batches of pairs of similar length, so little padding.
    window = cfg.data.length_group_window if cfg.data.length_grouped else 0
    lengths = [len(p.prompt) + len(p.chosen) + len(p.rejected) if share_prompt else p.length
               for p in train_pairs]
    sampler = GlobalBatchSampler(len(train_pairs), cfg.train.batch_size, cfg.train.seed,
                                 lengths=lengths, group_window=window)
    # Tokens in the rows the step computes: a prefix-shared row holds its prompt once.
    prompts = 1 if share_prompt else 2
    tokens = sum(prompts * len(p.prompt) + len(p.chosen) + len(p.rejected) for p in train_pairs)
    return TrainingData(
        tokenizer=tokenizer, train_pairs=list(train_pairs), eval_pairs=list(eval_pairs), sampler=sampler,
        counts=dict(counts), end_of_turn=encoded.end_of_turn,
        longest_row=max(lengths),
        response_fraction=sum(len(p.chosen) + len(p.rejected) for p in train_pairs) / max(1, tokens),
    )


def build_models(cfg: Config, env: RankEnv, plan: ParallelPlan, device: torch.device, tokenizer,
                 with_reference: bool) -> Models:
    """Policy and reference, sharded (or moved) onto this rank's device as the parallel plan says."""
    check_fsdp_config(cfg.fsdp, env.world_size, cfg.resources.nproc_per_node, device.type)
    policy = build_policy(cfg.model, tokenizer, cfg.train.seed)
    num_params = sum(p.numel() for p in policy.parameters())
    model_flops = ModelFlops.of(policy, cfg.model.block_name)
    mesh = build_mesh(plan, device.type)
    # with the malloc the ranks run with (each checked it is the config's: train/lifecycle.py)
    layout = {**rank_layout(mesh, env.local_rank), "cpu_allocator": allocator_in_use()}
    mp_policy = mixed_precision_policy(plan)
    shard = dict(plan=plan, block_name=cfg.model.block_name, mesh=mesh, device=device, compiled=cfg.train.compile)
    if cfg.peft.method != "none":  # adapters: the reference is the base with them switched off, no second model
        quantized = 0
        if cfg.peft.method == "qlora":  # the frozen base's linear layers in 4-bit (bitsandbytes)
            quantized = quantizable_params(policy, cfg.model.block_name)
            policy = quantize_base(policy, cfg.peft, cfg.model.block_name, plan.param_dtype, device)
        torch.manual_seed(cfg.train.seed)  # the same adapter initialization on every rank
        policy = add_adapters(policy, cfg.peft, cfg.model.block_name, start=start_adapter(cfg.model),
                              reference_copy=with_reference and cfg.train.reference_sync.every_steps > 0)
        adapted = ModelShape.of(policy)  # its trained share; a packed 4-bit weight counts as fewer elements
        shape = replace(adapted, num_params=num_params + adapted.trained, quantized_params=quantized,
                        double_quant=cfg.peft.double_quant)
        policy = shard_model(policy, mp_policy=mp_policy, **shard)
        reference = AdapterReference(policy) if with_reference else None
        return Models(policy=policy, reference=reference, num_params=num_params, model_flops=model_flops,
                      layout=layout, shape=shape)
    # The reference never trains: it is stored and run in the run's parameter dtype, so it needs no
    # cast of its own (an empty policy).
    reference = shard_model(
        build_reference(policy, torch_dtype(plan.param_dtype)),
        mp_policy=MixedPrecisionPolicy(), trainable=False, **shard,
    ) if with_reference else None
    shape = ModelShape.of(policy)
    policy = shard_model(policy, mp_policy=mp_policy, **shard)
    return Models(policy=policy, reference=reference, num_params=num_params, model_flops=model_flops,
                  layout=layout, shape=shape)


def build_optimizer(train: TrainConfig, policy: torch.nn.Module) -> torch.optim.Optimizer:
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = {"adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop}[train.optimizer]  # schema.OPTIMIZERS
    return optimizer(params, lr=train.lr, weight_decay=train.weight_decay)


# train.lr_schedule (schema.LR_SCHEDULES): the share of train.lr after the warm-up, from the progress
# through the remaining steps (0 at the warm-up's end, below 1 on every step that trains).
DECAYS: dict[str, Callable[[float], float]] = {
    "constant": lambda progress: 1.0,
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


def lr_factor(step: int, train: TrainConfig) -> float:
    """The share of train.lr that optimizer step `step` (0-based) takes: a linear warm-up whose first step
    is already lr / (warmup + 1), then the schedule's decay (`DECAYS`) towards 0 at train.max_steps."""
    decay, warmup = DECAYS[train.lr_schedule], train.warmup_steps
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return decay((step - warmup) / max(1, train.max_steps - warmup))


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """train.lr times `lr_factor` of the step; a resumed run restores the step count (train/checkpoint.py)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, train))


@dataclass
class SetupSummary:
    """What summary.json says of a run's setup, noted as each part is built: a run that fails part-way
    through its setup still reports what it got to."""

    data: dict[str, int] | None = None  # summary.json's `data`: the pairs loaded, truncated and dropped
    layout: dict[str, Any] | None = None  # summary.json's `layout`, once the mesh is built


@dataclass(frozen=True)
class TrainingSetup:
    """Everything the training loop trains with, built once before its first step (`build_training`)."""

    tokenizer: Any
    end_of_turn: str | None  # the chat template's end-of-turn token, when pairs were rendered with one
    train_pairs: list[EncodedPair]  # with the reference's log-probs attached, when they were precomputed
    eval_pairs: list[EncodedPair]
    # This rank's held-out micro-batches (indices into eval_pairs; >= len(eval_pairs): padding), cut by
    # train.eval_micro_batch_size or, null, by the memory a training micro-batch takes.
    eval_batches: list[list[int]]
    sampler: GlobalBatchSampler
    policy: torch.nn.Module
    reference: torch.nn.Module | None  # None when the loss needs none, or once its log-probs are precomputed
    num_params: int
    model_flops: ModelFlops
    shape: ModelShape
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: DynamicLossScaler
    reference_precompute_s: float | None  # the one-time scoring pass, outside the timed steps
    # For the memory estimate: the widest row, the scored share of tokens, the process's resident bytes
    # before the model was built, and whether a run trained in this process before (a probe batch).
    longest_row: int
    response_fraction: float
    rss_before_model: int
    runtime_resident: bool


def build_training(cfg: Config, base_dir: Path, env: RankEnv, plan: ParallelPlan, device: torch.device, *,
                   probing: bool, stop_requests: StopRequests, summary: SetupSummary) -> TrainingSetup:
    """Build, in order: the data, the models, the optimizer, the reference's log-probs (then the reference
    is freed, train.precompute_reference_logps), the optimizer's schedule and the loss scaler. `summary` gets
    summary.json's `data` and `layout` as soon as they are known."""
    data = build_data(cfg, base_dir, env)
    summary.data = data.counts
    if device.type == "cpu" and env.is_main and (why := slow_on_this_cpu(plan.param_dtype)):
        log.warning("precision=%s: %s", cfg.precision.name, why)
    load_model_code(cfg.model, adapters=cfg.peft.method != "none")  # its memory belongs in the baseline
    release_freed_heap()  # the baseline holds no heap freed before (a process that trained already)
    rss_before_model = resident_bytes() if device.type == "cpu" else 0  # for the memory estimate
    runtime_resident = trained_before()
    models = build_models(cfg, env, plan, device, data.tokenizer, with_reference=uses_reference(cfg.loss))
    summary.layout = models.layout
    policy, reference, num_params, model_flops = models.policy, models.reference, models.num_params, models.model_flops
    shape = models.shape
    del models  # `reference` is then the only name of the reference model, for free_reference
    # Built before any forward: a reference pass through the policy (adapters off) with
    # reshard_after_forward=false leaves parameters() yielding unsharded tensors that never get a grad.
    optimizer = build_optimizer(cfg.train, policy)
    # Held-out passes without grad: as many pairs a pass as fit where training peaks (memory_estimate.py).
    batching = eval_batching(shape, run_shape_of(cfg, plan, seq_len=data.longest_row,
                                                 response_fraction=data.response_fraction,
                                                 allocator=allocator_in_use()))
    eval_batches = eval_micro_batch_indices([pair_tokens(p, cfg.train.share_prompt) for p in data.eval_pairs],
                                            env.rank, env.world_size, batching)
    if env.is_main:
        log.info("eval: %d held-out pairs in %d passes per rank, up to %d pairs a pass (train.eval_micro_batch_size=%s)",
                 len(data.eval_pairs), len(eval_batches), max(map(len, eval_batches)), cfg.train.eval_micro_batch_size)
    precompute_s = None
    if reference is not None and cfg.train.precompute_reference_logps:
        precompute_s = precompute_reference_logps(data, reference, cfg, env, device, probing, stop_requests,
                                                  batching, eval_batches)
        reference = None
        free_reference(device)
    return TrainingSetup(
        tokenizer=data.tokenizer, end_of_turn=data.end_of_turn, train_pairs=data.train_pairs,
        eval_pairs=data.eval_pairs, eval_batches=eval_batches, sampler=data.sampler, policy=policy, reference=reference,
        num_params=num_params, model_flops=model_flops, shape=shape, optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg.train), scaler=loss_scaler(plan),
        reference_precompute_s=precompute_s, longest_row=data.longest_row,
        response_fraction=data.response_fraction, rss_before_model=rss_before_model,
        runtime_resident=runtime_resident)
