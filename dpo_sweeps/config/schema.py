"""The typed schema of a dpo-sweeps config: one dataclass per section, a docstring under every field.

These dataclasses say which keys exist, what type each has, its default, what it does, which values it
accepts and when a run reads it: a field made with `setting(default, accepted=..., read_when=...)`
(setting.py) carries all of it, the docstring under it says what it does, and nothing else repeats it
(conf/config.yaml holds only the defaults list; `--help`, the config reference page, the checks and
checks/unused.py read it from here). conf/'s group files choose the values left `???` (MISSING) here:
a model's, a precision's, a loss's. Hydra validates every composed config against them (conf/config.yaml's
defaults list starts with `dpo_sweeps_schema`; each group file starts with its own `/schema/<group>/...`),
so an unknown key (`train.lr_rate=1`) or a wrong type (`train.batch_size=abc`) is refused while the
config is composed, before anything runs.

Once resolved, a config is read as these same dataclasses: `Config.of(resolved)` is the frozen, typed
config every rank trains with. Each
section checks its own fields' values in `check` (a `setting`'s from its metadata, the rules between
fields written there); the checks that span sections are in checks/validate.py, which runs both.

`tracking`'s sections, one per tracker, are in tracking_schema.py. `loss` is typed per loss, as `data` is
per source: each loss has its own hyperparameters, so its dataclass is made from the loss registry
(dpo/losses/schema.py, `schema/loss/NAME`) and conf/config.yaml types the chosen loss with it.
`model.from_config` is a mapping: the transformers config of a model family.

This module imports only dataclasses, omegaconf, hydra and dpo_sweeps.config: every process that
composes a config (the CLI, a sweep's job, a test) registers it by importing `dpo_sweeps`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from dpo_sweeps.config.data_schema import DATA_SCHEMAS, data_config
from dpo_sweeps.config.section import Section, at_least, positive_number, refuse, section_types
from dpo_sweeps.config.setting import (
    AtLeast,
    Launch,
    NumberAtLeast,
    OneOf,
    Positive,
    ReadWhen,
    Rule,
    choices,
    setting,
)
from dpo_sweeps.config.settings_help import register_resolver as register_settings_help
from dpo_sweeps.config.smoke import smoke_cut
from dpo_sweeps.config.tracking_schema import FormerWandbConfig, TrackingConfig, move_renamed

DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("adamw", "rmsprop")
LR_SCHEDULES = ("constant", "linear", "cosine")
TOKENIZER_KINDS = ("byte", "bpe", "pretrained")
# A BPE's vocabulary holds the 256 bytes and the special tokens before any merge.
MIN_BPE_VOCAB = 259
STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")


# The reference's settings: a loss without a reference (simpo, orpo, sft; reference_free=true) reads none.
# Which losses have one is the loss registry's (dpo/losses), so checks/unused.py decides the rule.
_NO_REFERENCE_TO_SYNC = ReadWhen(Rule("no_reference"), "this loss has no reference model to sync",
                                 "a loss with a reference, reference_free=false")


@dataclass
class ReferenceSyncConfig(Section):
    """TR-DPO (Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good Alignment"; TRL's
    sync_ref_model): every `every_steps` optimizer steps the reference moves toward the policy,
    ref <- alpha * policy + (1 - alpha) * ref (train/reference_sync.py)."""

    at = "train.reference_sync"

    every_steps: int = setting(0, accepted=AtLeast(0, "an integer >= 0 (0: no sync)"), read_when=(
        _NO_REFERENCE_TO_SYNC, ReadWhen(lambda c, _: c.train.precompute_reference_logps, "the reference is scored "
                                        "once before training, so it cannot move",
                                        "train.precompute_reference_logps=false")))
    """Optimizer steps between two syncs (>= 0); 0: the reference stays as it starts (plain DPO)."""
    alpha: float = setting(0.6, read_when=(
        _NO_REFERENCE_TO_SYNC,
        ReadWhen(lambda c, _: c.train.precompute_reference_logps, "the reference is scored once before training, "
                 "so it cannot move", "train.precompute_reference_logps=false"),
        ReadWhen(lambda c, _: not c.train.reference_sync.every_steps, "no sync at train.reference_sync.every_steps=0",
                 "train.reference_sync.every_steps > 0")))
    """The policy's weight in each sync (0 < alpha <= 1; 1: the reference becomes the policy)."""

    def check(self) -> None:
        super().check()
        if self.every_steps and not (isinstance(self.alpha, int | float) and 0 < self.alpha <= 1):
            refuse("train.reference_sync.alpha", f"got {self.alpha!r}", "a number > 0 and <= 1")


# train.sample_prompts and sample_max_new_tokens: the replies after training come from the saved model.
_NOT_SAVED = ReadWhen(lambda c, _: not c.train.save_model, "the replies after training come from the saved model",
                      "train.save_model=true")


@dataclass
class TrainConfig(Section):
    """The training loop: batch, optimizer, schedule, evaluation, what a run saves. Each field's default,
    accepted values and when it is read are beside it (config/setting.py); conf/config.yaml repeats none."""

    at = "train"

    batch_size: int = setting(32, accepted=AtLeast(1))
    """Global batch, in preference pairs, summed over all ranks and accumulation steps (>= 1)."""
    micro_batch_size: int = setting(8, accepted=AtLeast(1))
    """Pairs per rank per forward pass; batch_size must be a multiple of micro_batch_size x ranks."""
    max_steps: int = setting(120, accepted=AtLeast(1))
    """Optimizer steps to train (>= 1)."""
    lr: float = setting(3.0e-3, accepted=Positive())
    """Peak learning rate (> 0)."""
    optimizer: str = setting("adamw", accepted=OneOf(OPTIMIZERS, unknown="optimizer"))
    """adamw | rmsprop."""
    weight_decay: float = setting(0.0, accepted=NumberAtLeast(0, "a number >= 0"))
    """The optimizer's decoupled (adamw) or L2 (rmsprop) weight decay (>= 0)."""
    warmup_steps: int = setting(10, accepted=AtLeast(0))
    """Steps of linear warmup from 0 to train.lr (>= 0); then train.lr_schedule."""
    lr_schedule: str = setting("constant", accepted=OneOf(LR_SCHEDULES, unknown="schedule"), older_runs_lack=True)
    """After the warmup: constant (the reference DPO implementation), linear or cosine (decay to 0 at
    train.max_steps, as transformers' schedulers of those names; TRL's DPOTrainer defaults to linear)."""
    max_grad_norm: float | None = setting(10.0, accepted=Positive("a number > 0, or null for no clipping"))
    """Clip the global gradient norm to this (> 0); null: no clipping (grad_norm is still logged)."""
    eval_every: int = setting(40, accepted=AtLeast(0, "an integer >= 0 (0: only at the end)"))
    """Evaluate on the held-out pairs every N optimizer steps and at the end (>= 0; 0: only at the end)."""
    eval_max_pairs: int | None = setting(None, accepted=AtLeast(1, "an integer >= 1, or null for all", null=True))
    """Cap on held-out pairs evaluated (>= 1); null: all."""
    eval_micro_batch_size: int | None = setting(None, accepted=AtLeast(
        1, "an integer >= 1, or null for as many as fit in a training micro-batch's memory", null=True),
        older_runs_lack=True)
    """Held-out pairs per rank per eval forward pass, at most (>= 1). null: as many as fit in the memory a
    training micro-batch's forward and backward take (a no-grad forward saves nothing for a backward, so it
    holds several times the pairs); either way pairs of similar length pass together (parallel/memory_estimate.py
    eval_batching). A set value the training peak does not cover is added to the memory estimate."""
    log_every: int = setting(1, accepted=AtLeast(1))
    """Write a metrics.jsonl row every N optimizer steps (>= 1)."""
    seed: int = setting(0)
    """Seed of the model init, data order and dropout."""
    progress_bar: bool = setting(True)
    """Show a progress bar on rank 0."""
    save_model: bool = setting(True)
    """Save the final policy in Hugging Face format under <run dir>/model (rank 0 gathers it)."""
    save_merged: bool = setting(False, read_when=ReadWhen(
        lambda c, _: c.peft.method == "none" or not c.train.save_model,
        "only adapters are merged, into the saved model", "peft=lora with train.save_model=true"))
    """With peft (adapters) and save_model: also write the adapters merged into the base weights, a plain
    Hugging Face model, to <run dir>/model_merged (model/ holds the PEFT adapter folder)."""
    time_limit_min: float | None = setting(None, accepted=Positive("a number of minutes > 0, or null for none"))
    """Wall-time limit of one attempt, in minutes (> 0); when reached the run saves a checkpoint and
    ends failed with kind `timeout` (the same command resumes it). null: none."""
    precompute_reference_logps: bool = setting(True, read_when=ReadWhen(
        Rule("no_reference"), "this loss has no reference model to score", "a loss with a reference, reference_free=false"))
    """Score every pair under the frozen reference once before training, cache the scores on disk
    ($DPO_SWEEPS_CACHE/reference_logps) and free the reference model. false: a reference forward per step."""
    logps_chunk_size: int = setting(1024, accepted=AtLeast(0, "an integer >= 1, or 0 for full logits"))
    """Response log-probs from the LM head on response positions only, this many rows of logits at a
    time (>= 1): no [batch, length, vocab] fp32 logits. 0: full logits, as the reference DPO implementation."""
    share_prompt: bool = setting(True)
    """One row per pair, prompt + chosen + rejected, the prompt computed once (needs logps_chunk_size > 0
    and sdpa or eager attention). false: chosen and rejected rows, [2 x batch, length]."""
    packing: bool = setting(False, older_runs_lack=True)
    """Pack each micro-batch's pairs into rows of up to train.micro_batch_tokens tokens, each pair laid out
    as without packing (prompt shared or not), positions restarting at every pair and attention confined
    to the pair's own tokens (needs logps_chunk_size > 0). The pairs of a step, its loss and its gradient
    are the padded step's; only the padding goes. false: rows padded to the micro-batch's longest."""
    micro_batch_tokens: int | None = setting(None, accepted=AtLeast(
        1, "an integer >= 1, or null for the widest row one pair can take", null=True), read_when=ReadWhen(
        lambda c, _: not c.train.packing, "rows are packed only with train.packing=true", "train.packing=true"),
        older_runs_lack=True)
    """With packing: the most tokens in one packed row (>= 1, at least the widest row one pair can take).
    null: that widest row (data.max_length, or with share_prompt the prompt and both responses at their
    longest), so no packed row is wider than a padded one."""
    compile: bool = setting(False, older_runs_lack=True)
    """torch.compile each transformer block (under FSDP2, block by block; on CPU through inductor, which
    needs a C++ compiler). The first step's compile time is logged apart from the step time."""
    zero_shot_eval: bool = setting(False, older_runs_lack=True)
    """Before the first step, score the held-out pairs with the policy alone (log p(chosen) against
    log p(rejected), no reference): eval/zero_shot/{accuracy, margin, accuracy_ci95} in metrics.jsonl
    (step 0) and summary.json, the baseline beside eval/rewards/accuracies; every eval then also scores the
    trained policy alike, eval/policy/{accuracy, margin} (train/zero_shot.py)."""
    reference_sync: ReferenceSyncConfig = field(default_factory=ReferenceSyncConfig)
    """TR-DPO: the reference moves toward the policy during training (off by default)."""
    sample_prompts: int = setting(0, accepted=AtLeast(0, "an integer >= 0 (0: no samples.json)"),
                                  read_when=_NOT_SAVED, older_runs_lack=True)
    """> 0: after the final model is saved (needs save_model), rank 0 writes samples.json, the greedy
    replies to this many held-out prompts before and after training (train/samples.py). 0: none."""
    sample_max_new_tokens: int = setting(64, read_when=(_NOT_SAVED, ReadWhen(
        lambda c, _: not c.train.sample_prompts, "no replies are generated at train.sample_prompts=0",
        "train.sample_prompts > 0")), older_runs_lack=True)
    """With sample_prompts: the longest reply generated, in tokens (>= 1)."""

    def check(self) -> None:
        """Each field's accepted values (its `setting`), then the rules between fields."""
        super().check()
        self.reference_sync.check()
        if self.reference_sync.every_steps and self.precompute_reference_logps:
            refuse("train.reference_sync.every_steps", f"{self.reference_sync.every_steps} with "
                   "train.precompute_reference_logps=true (a reference that moves cannot be scored before training)",
                   "train.precompute_reference_logps=false, or 0 (no sync)")
        if self.sample_prompts:
            at_least(self.sample_max_new_tokens, 1, "train.sample_max_new_tokens")
            if not self.save_model:
                refuse("train.sample_prompts", f"{self.sample_prompts} with train.save_model=false",
                       "0, or train.save_model=true (the replies after training come from the saved model)")
        if self.packing and self.logps_chunk_size == 0:
            refuse("train.packing", "true with train.logps_chunk_size=0",
                   "train.logps_chunk_size > 0 (packed rows are scored on response positions)")
        if self.share_prompt and self.logps_chunk_size == 0:
            refuse("train.share_prompt", "true with train.logps_chunk_size=0",
                   "train.logps_chunk_size > 0 (prefix-shared batches are scored on response positions)")


# The keys model.init_from's saved model brings with it (its architecture and tokenizer): read only where
# init_from is null or names adapters. Whether it names adapters is decided on disk (models/adapters.py).
_SAVED_MODEL = ReadWhen(Rule("init_from_full_model"), "model.init_from's saved model brings its own architecture "
                        "and tokenizer", "model.init_from=null")


@dataclass
class TokenizerConfig(Section):
    """How text becomes tokens (models/tokenizers: built by dpo-sweeps, or the pretrained model's)."""

    at = "model.tokenizer"

    # A model's conf/model file always sets both: they stay MISSING here (`???`), as in ModelConfig.
    kind: str = setting(accepted=OneOf(TOKENIZER_KINDS, unknown="kind"), read_when=_SAVED_MODEL)
    """byte: 256 byte tokens + specials; bpe: a byte-level BPE trained on the run's training text
    (cached); pretrained: AutoTokenizer.from_pretrained(model.name_or_path)."""
    vocab_size: int | None = setting(read_when=(_SAVED_MODEL, ReadWhen(
        lambda c, _: c.model.tokenizer.kind != "bpe", "only a trained BPE has a vocabulary size to choose",
        "model.tokenizer.kind=bpe")))
    """bpe only: the vocabulary size (> 258); null for byte and pretrained."""

    def check(self) -> None:
        """The kind (its `setting`), then a BPE's vocabulary size: only a BPE reads it."""
        super().check()
        if self.kind == "bpe":
            at_least(self.vocab_size, MIN_BPE_VOCAB, "model.tokenizer.vocab_size",
                     f"an integer >= {MIN_BPE_VOCAB} for kind=bpe")


@dataclass
class ModelConfig(Section):
    """The network a run trains: a hub model, a transformers config's random init, a GGUF file, or the model an
    earlier run saved (init_from)."""

    at = "model"

    # The keys left MISSING (`???`) are those every conf/model file sets: a model is chosen as a whole, so the
    # schema holds no default of its own for them.
    name_or_path: str = setting()
    """A hub model name or local folder for from_pretrained, or a label when from_config builds it."""
    block_name: str = setting()
    """The transformer block class FSDP wraps, one FSDP unit per block (e.g. GPT2Block)."""
    init_from: str | None = setting()
    """A run directory of an earlier run (e.g. loss=sft) whose saved model is the policy's start and
    the reference; when it saved a LoRA adapter (peft=lora), the base is built as the other model.* keys
    say and, with peft=lora, the policy trains a copy of the adapter against a frozen one (docs/lora.md).
    null: name_or_path / from_config."""
    from_config: dict[str, Any] | None = setting(read_when=_SAVED_MODEL)
    """transformers config kwargs (model_type and its family's keys) of a random-init model;
    null: load name_or_path with from_pretrained."""
    tokenizer: TokenizerConfig = MISSING
    """How text becomes tokens."""
    gguf_file: str | None = setting(None, read_when=_SAVED_MODEL, older_runs_lack=True)
    """A GGUF model file (any architecture transformers reads from GGUF) whose weights, tokenizer and
    chat template the run loads, or pkg://PACKAGE/FILE for a file inside an installed Python package
    (found without importing it). Dequantized once and cached as safetensors under
    $DPO_SWEEPS_CACHE/gguf/<content hash> (models/gguf.py). Needs from_config null and tokenizer.kind
    pretrained; null: name_or_path / from_config."""
    install_hint: str | None = setting(None, read_when=(_SAVED_MODEL, ReadWhen(
        lambda c, _: c.model.gguf_file is None, "it is shown only when a model.gguf_file cannot be found",
        "a model.gguf_file")))
    """How to get the model's files where they are missing (e.g. a pip command), shown in the error."""

    def check(self) -> None:
        """Its own settings; whether the GGUF file is there is checks/validate.py's (it looks on disk)."""
        if self.block_name in (None, ""):
            refuse("model.block_name", "not set", "the transformer block class FSDP wraps, e.g. GPT2Block")
        self.tokenizer.check()
        if self.gguf_file is not None:
            if self.from_config is not None:
                refuse("model.from_config", "set together with model.gguf_file",
                       "null with model.gguf_file (the GGUF file holds the architecture)")
            if self.tokenizer.kind != "pretrained":
                refuse("model.tokenizer.kind", f"{self.tokenizer.kind} with model.gguf_file",
                       "pretrained (the GGUF file's own tokenizer)")


def _unwrapped(cfg: Any, _: Launch) -> bool:
    """One rank, fp32, no offload: the model runs as it is, without FSDP (parallel/fsdp.py needs_fully_shard)."""
    precision = cfg.precision
    return (cfg.world_size == 1 and not cfg.fsdp.cpu_offload
            and precision.param_dtype == "float32" and precision.reduce_dtype == "float32")


@dataclass
class FsdpConfig(Section):
    """fsdp=<conf/fsdp file>: how parameters are sharded. The mesh the strategy makes of the ranks is the
    plan's to check (parallel/plan.py, with resources)."""

    at = "fsdp"

    sharding_strategy: str = setting(accepted=OneOf(STRATEGIES, unknown="strategy"))
    """full_shard | shard_grad_op | hybrid_shard | no_shard."""
    reshard_after_forward: bool = setting(read_when=ReadWhen(
        _unwrapped, "one fp32 rank without offload runs the model without FSDP, so nothing is resharded",
        "resources.nproc_per_node > 1, precision=bf16 or fp16, or fsdp.cpu_offload=true"))
    """Free the gathered parameters after forward and gather them again for backward (ZeRO-3)."""
    hybrid_group_size: int | None = setting(read_when=ReadWhen(
        lambda c, _: c.fsdp.sharding_strategy != "hybrid_shard", "only hybrid_shard has shard groups",
        "fsdp=hybrid_shard"))
    """hybrid_shard: ranks per shard group (a divisor of the world size); null: the ranks of one node."""
    activation_checkpointing: bool = setting()
    """Recompute each block's activations in backward instead of keeping them."""
    cpu_offload: bool = setting()
    """Keep parameters, gradients and optimizer state in CPU memory (CUDA runs only)."""


PEFT_METHODS = ("none", "lora", "qlora")
# peft=qlora: bitsandbytes' 4-bit data types, and the float dtypes its packed weights and its matmuls may use.
QUANT_TYPES = ("nf4", "fp4")
QUANT_FLOAT_DTYPES = ("float32", "bfloat16", "float16")


# The adapters' settings, and the 4-bit base's: read only where there are adapters, and a 4-bit base.
_NO_ADAPTERS = ReadWhen(lambda c, _: c.peft.method == "none", "peft=none is a full fine-tune: there are no adapters",
                        "peft=lora or peft=qlora")
_NOT_QLORA = ReadWhen(lambda c, _: c.peft.method != "qlora", "only peft=qlora quantizes the base", "peft=qlora")


@dataclass
class PeftConfig(Section):
    """Parameter-efficient fine-tuning with the `peft` library (models/adapters.py): the policy trains
    LoRA adapters on frozen base weights (4-bit ones with qlora: models/quantize.py), and the reference is
    the base with its adapters switched off (no second model). docs/lora.md says what runs."""

    at = "peft"

    method: str = setting("none", accepted=OneOf(PEFT_METHODS, unknown="method",
                                                 said="peft=none, peft=lora or peft=qlora"))
    """none (a full fine-tune) | lora | qlora (LoRA on a 4-bit base); the conf/peft file's name."""
    r: int = setting(16, accepted=AtLeast(1, "an integer >= 1 (the adapters' rank)"), read_when=_NO_ADAPTERS)
    """LoRA rank: the inner size of each adapter (>= 1)."""
    alpha: float = setting(32.0, accepted=Positive(), read_when=_NO_ADAPTERS)
    """LoRA alpha: the adapters' output is scaled by alpha / r (alpha / sqrt(r) with use_rslora) (> 0)."""
    dropout: float = setting(0.0, read_when=_NO_ADAPTERS)
    """Dropout on the adapters' input while training (0 <= dropout < 1)."""
    target_modules: list[str] | None = setting(None, read_when=_NO_ADAPTERS)
    """Leaf names of the modules that get adapters (e.g. [q_proj, v_proj]); a name the model lacks is
    refused, listing its linear layers. null: every linear layer of the blocks (model.block_name)."""
    use_rslora: bool = setting(False, read_when=_NO_ADAPTERS)
    """Rank-stabilized LoRA: scale by alpha / sqrt(r) instead of alpha / r."""
    use_dora: bool = setting(False, read_when=_NO_ADAPTERS)
    """DoRA: weight-decomposed adapters (a trained magnitude per output feature beside LoRA's direction)."""
    modules_to_save: list[str] | None = setting(None, read_when=_NO_ADAPTERS)
    """Leaf names of modules trained in full beside the adapters (e.g. [lm_head]), saved with them; null: none."""
    quantization: str = setting("nf4", accepted=OneOf(QUANT_TYPES, unknown="4-bit type", said=" or ".join(QUANT_TYPES)),
                                read_when=_NOT_QLORA)
    """peft=qlora: the 4-bit data type of the frozen base's linear layers (bitsandbytes): nf4 | fp4."""
    bnb_4bit_quant_storage: str | None = setting(None, accepted=OneOf(
        QUANT_FLOAT_DTYPES, null=True, said=f"null or one of {', '.join(QUANT_FLOAT_DTYPES)}"), read_when=_NOT_QLORA)
    """peft=qlora: the float dtype the packed 4-bit weights are stored in, so that FSDP2 shards them as
    any parameter; it must be the precision's param_dtype (FSDP2 would cast packed bits otherwise).
    null: the precision's param_dtype."""
    bnb_4bit_compute_dtype: str | None = setting(None, accepted=OneOf(
        QUANT_FLOAT_DTYPES, null=True, said=f"null or one of {', '.join(QUANT_FLOAT_DTYPES)}"), read_when=_NOT_QLORA)
    """peft=qlora: the dtype the 4-bit layers dequantize to and multiply in: float32 | bfloat16 | float16;
    null: the precision's param_dtype."""
    double_quant: bool = setting(False, read_when=_NOT_QLORA)
    """peft=qlora: also quantize the quantization constants (bitsandbytes' compress_statistics)."""

    def check(self) -> None:
        """A full fine-tune reads no setting but `method` (checks/unused.py refuses one set with it); with
        adapters, each field's accepted values, then the rules that are not a list of values."""
        if self.method == "none":
            return
        super().check()
        if not 0 <= self.dropout < 1:
            refuse("peft.dropout", f"got {self.dropout!r}", "a number >= 0 and < 1")
        if self.target_modules is not None and not self.target_modules:
            refuse("peft.target_modules", "an empty list", "null (every linear layer of the blocks) or module names")


# precision.initial_loss_scale and loss_scale_growth_interval: read only with loss scaling.
_NO_LOSS_SCALING = ReadWhen(lambda c, _: not c.precision.loss_scaling, "they act only with loss scaling",
                            "precision=fp16, or precision.loss_scaling=true")


@dataclass
class PrecisionConfig(Section):
    """precision=<conf/precision file>: compute and reduction dtypes (checked by the plan, parallel/plan.py
    DTYPES), and fp16's loss scaling."""

    at = "precision"

    name: str = setting(read_when=ReadWhen(
        lambda c, _: True, "a run names its precision from precision.param_dtype and reduce_dtype (summary.json's "
        "plan); the name only names a conf/precision file", "precision=fp32, bf16 or fp16"))
    """The conf/precision file's name: fp32 | bf16 | fp16. A run names its precision from the dtypes below
    (summary.json's plan); the report falls back on this name only for a run without a plan."""
    param_dtype: str = setting()
    """Compute dtype of the sharded parameters: float32 | bfloat16 | float16."""
    reduce_dtype: str = setting()
    """Dtype gradients are reduced in: float32 | bfloat16 | float16."""
    loss_scaling: bool = setting()
    """Dynamic loss scaling (fp16); the skip-step decision is all-reduced so every rank steps together."""
    initial_loss_scale: float = setting(65536.0, accepted=Positive(), read_when=_NO_LOSS_SCALING)
    """With loss_scaling: the first loss scale (> 0)."""
    loss_scale_growth_interval: int = setting(200, accepted=AtLeast(1), read_when=_NO_LOSS_SCALING)
    """With loss_scaling: steps without overflow before the scale doubles (>= 1)."""

    def check(self) -> None:
        """The loss-scaling settings, checked only with loss scaling (where they are read)."""
        if self.loss_scaling:
            super().check()


# resources.cpu_allocator: the malloc of the processes that train (dpo_sweeps/parallel/allocator.py).
CPU_ALLOCATORS = ("auto", "glibc", "tcmalloc")


def _port_chosen_elsewhere(cfg: Any, launch: Launch) -> bool:
    return launch == Launch.TORCHRUN or (launch in (Launch.LOCAL, Launch.SLURM) and cfg.world_size > 1)


def _not_bound_here(cfg: Any, launch: Launch) -> bool:
    return (cfg.resources.nproc_per_node == 1 or cfg.resources.device == "cuda"
            or launch in (Launch.TORCHRUN, Launch.SLURM))


@dataclass
class ResourcesConfig(Section):
    """The ranks a run has and the machine they run on. Each field's default, accepted values and when it is
    read are beside it (config/setting.py); conf/config.yaml repeats none."""

    at = "resources"

    nodes: int = setting(1, accepted=AtLeast(1))
    """Nodes of the run (>= 1)."""
    nproc_per_node: int = setting(1, accepted=AtLeast(1))
    """Ranks per node: GPUs per node, or CPU processes where there is no GPU (>= 1)."""
    device: str = setting("auto", accepted=OneOf(DEVICES))
    """cpu | cuda | auto (cuda when available, decided on the job's node)."""
    master_port: int | None = setting(None, read_when=ReadWhen(
        _port_chosen_elsewhere, "torchrun, or the sweep launcher's tasks, choose the rendezvous port",
        "torchrun --master_port; nothing for a sweep's job"))
    """Rendezvous port for local ranks; null picks a free one and prints it."""
    device_memory_gib: float | None = setting(None, accepted=Positive(
        "a number of GiB > 0, or null (the CUDA device's memory; no check on CPU)"))
    """Memory of one device in GiB (> 0) for the fit check before a sweep launches; null: the CUDA
    device's memory when the run uses CUDA, no check on CPU."""
    collective_timeout_s: float = setting(300.0, accepted=Positive("a number of seconds > 0"))
    """Seconds a collective may wait before a rank gives up (a dead peer ends the run, never a hang)."""
    hang_timeout_s: float | None = setting(None, accepted=Positive(
        "a number of seconds > 0, or null for resources.collective_timeout_s"))
    """Seconds without progress (no training step phase, eval batch or checkpoint on any rank) after which
    the run ends failed with kind `hang`, naming the rank that held the others up (runtime/watchdog.py;
    watched from the first training step on) (> 0); null: collective_timeout_s."""
    threads_per_rank: int | None = setting(None, accepted=AtLeast(1, "an integer >= 1, or null", null=True))
    """CPU threads per rank (>= 1); null: cores / local ranks."""
    bind_cores: bool = setting(True, read_when=ReadWhen(
        _not_bound_here, "ranks are bound to cores only when several CPU ranks start on a node without torchrun "
        "or srun", "resources.nproc_per_node > 1 on CPUs, started by dpo-sweeps or a local sweep"))
    """Bind the CPU ranks dpo-sweeps starts itself each to its own block of the job's cores (torchrun and
    SLURM tasks are bound by their launcher, e.g. srun --cpu-bind; GPU ranks are not bound)."""
    cpu_allocator: str = setting("auto", accepted=OneOf(CPU_ALLOCATORS))
    """auto | glibc | tcmalloc: the malloc of the processes that train (parallel/allocator.py). tcmalloc
    (gperftools, preloaded into the ranks dpo-sweeps starts) holds less freed memory than glibc's heap, run
    after run. auto: tcmalloc for runs of several CPU ranks where its library is found, else glibc (one
    rank trains in the process it was started in, with its malloc)."""

    @property
    def world_size(self) -> int:
        """The run's ranks: nodes x ranks per node."""
        return int(self.nodes) * int(self.nproc_per_node)


# The precisions a cluster profile gives a dense peak for (fp32 plain, tf32 tensor cores, bf16, fp16).
PEAK_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# The numbers a profile must give unless it is measured on this machine (cluster=cpu).
CLUSTER_NUMBERS = ("device_memory_gib", "memory_bandwidth_gb_s", "intra_node_gb_s", "intra_node_latency_us",
                   "inter_node_gb_s", "inter_node_latency_us")


# cluster=cpu measures its numbers: the figures a datasheet gives are not read there.
_MEASURED = ReadWhen(lambda c, _: c.cluster is not None and c.cluster.measured,
                     "cluster=cpu measures its numbers on this machine (dpo_sweeps/cost/cpu_profile.py)",
                     "a profile with cluster.measured=false (a conf/cluster file, or your own)")


@dataclass
class ClusterConfig(Section):
    """cluster=<conf/cluster file>: the hardware a run's cost is predicted on (dpo_sweeps/cost/). Figures
    from the vendors' datasheets, each with its source under `sources`; a custom profile is a file of the
    same keys in a config directory of your own (hydra.searchpath), chosen by its name."""

    at = "cluster"

    name: str = setting()
    """The profile's name, as reports and the dry run show it."""
    gpus_per_node: int = setting(accepted=AtLeast(1))
    """Devices in one node (>= 1): resources.nproc_per_node may not exceed it."""
    max_nodes: int | None = setting(None, accepted=AtLeast(1, "an integer >= 1, or null for no limit", null=True))
    """Nodes the cluster has (>= 1): resources.nodes may not exceed it; null: no limit."""
    device_memory_gib: float | None = setting(None, read_when=_MEASURED)
    """Memory of one device, GiB (> 0): the fit check's limit unless resources.device_memory_gib is set."""
    memory_bandwidth_gb_s: float | None = setting(None, read_when=_MEASURED)
    """Device memory bandwidth, GB/s (> 0): the optimizer step's time."""
    peak_tflops: dict[str, float] | None = setting(None, read_when=_MEASURED)
    """Dense peak TFLOP/s per precision: fp32, tf32, bf16, fp16 (each > 0; at least fp32 and bf16)."""
    intra_node_gb_s: float | None = setting(None, read_when=_MEASURED)
    """Bandwidth one device has to the others of its node, one way, GB/s (> 0): NVLink or PCIe."""
    intra_node_latency_us: float | None = setting(None, read_when=_MEASURED)
    """Latency of one step of a collective inside a node, microseconds (>= 0)."""
    inter_node_gb_s: float | None = setting(None, read_when=_MEASURED)
    """Bandwidth one device has to other nodes, one way, GB/s (> 0): its InfiniBand or RoCE share."""
    inter_node_latency_us: float | None = setting(None, read_when=_MEASURED)
    """Latency of one step of a collective across nodes, microseconds (>= 0)."""
    measured: bool = setting(False)
    """true: the numbers are measured on this machine (cluster=cpu), not given; the file leaves them null."""
    sources: dict[str, str] = setting(default_factory=dict)
    """Where each figure comes from (a datasheet, or the measurement): key -> citation."""

    def check(self) -> None:
        if not self.name:
            refuse("cluster.name", "not set", "the profile's name")
        super().check()
        if self.measured:
            return
        for key in CLUSTER_NUMBERS:
            value = getattr(self, key)
            if value is None:
                refuse(f"cluster.{key}", "missing", "a number (the datasheet's figure, with its source in cluster.sources)")
            if key.endswith("latency_us"):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    refuse(f"cluster.{key}", f"got {value!r}", "a number of microseconds >= 0")
            else:
                positive_number(value, f"cluster.{key}", "a number > 0")
        peaks = self.peak_tflops or {}
        for precision, value in peaks.items():
            if precision not in PEAK_PRECISIONS:
                refuse(f"cluster.peak_tflops.{precision}", "unknown precision", ", ".join(PEAK_PRECISIONS))
            positive_number(value, f"cluster.peak_tflops.{precision}", "a number of TFLOP/s > 0")
        for precision in ("fp32", "bf16"):
            if precision not in peaks:
                refuse(f"cluster.peak_tflops.{precision}", "missing", "the dense peak in TFLOP/s")
        if not self.sources:
            refuse("cluster.sources", "empty", "where each figure comes from (key: datasheet)")


@dataclass
class PerfConfig(Section):
    at = "perf"

    warmup_steps: int = setting(3, accepted=AtLeast(0))
    """Steps ignored before timing starts (compilation, allocator warm-up) (>= 0)."""


@dataclass
class ProbeConfig(Section):
    """probe.steps is checked here against its own range; that it leaves timed steps after perf.warmup_steps is
    checks/validate.py's."""

    at = "probe"

    steps: int = setting(0, accepted=AtLeast(0, "0 (a normal run) or the number of steps to probe"))
    """> 0: train only this many steps (the first perf.warmup_steps untimed) to measure speed and peak
    memory; no periodic eval, saved model, checkpoints or reference pass. 0: a normal run."""

    max_seconds: float | None = setting(
        None, accepted=Positive("null (no limit) or a number of seconds > 0"), older_runs_lack=True,
        read_when=ReadWhen(lambda c, _: c.probe.steps == 0, "only a probe has a time limit, and probe.steps=0 is a "
                           "normal run", "probe.steps > 0 (find_best: hydra.sweeper.stages.probe_max_seconds)"))
    """> 0: the probe also ends once its steps have run this long (wall seconds from its first step), though
    never before one timed step after perf.warmup_steps: a plan far slower than the others costs little to
    rule out. summary.json: probe/steps (as many as it ran) and probe/stopped_at_max_seconds. null: none."""


# faults.kind's accepted values (besides null); train/faults.py injects them.
FAULT_KINDS = ("nan_loss", "crash", "oom", "sigkill", "hang", "sigkill_in_checkpoint")
_NO_FAULT = ReadWhen(lambda c, _: c.faults.kind in (None, "null"), "no fault is injected with faults.kind=null",
                     "faults.kind=crash (or another kind)")


@dataclass
class FaultsConfig(Section):
    """Fault injection, for tests (train/faults.py): at optimizer step `step` on rank `rank`, `kind` happens:
    nan_loss (the loss becomes NaN), crash (an exception), oom (an out-of-memory error), sigkill (the rank
    process is killed), hang (the rank sleeps forever in the step), sigkill_in_checkpoint (the rank is
    killed inside the save of checkpoint `step`, its files written, before it is complete). Faults fire
    only in an attempt that started from step 0, so running the same command again shows the recovery."""

    at = "faults"

    kind: str | None = setting(None, accepted=OneOf(FAULT_KINDS, unknown="fault", null=True))
    """For tests: null | nan_loss | crash | oom | sigkill | hang | sigkill_in_checkpoint (train/faults.py)."""
    step: int = setting(1, read_when=_NO_FAULT)
    """The optimizer step the fault fires at."""
    rank: int = setting(0, read_when=_NO_FAULT)
    """The rank it fires on."""


@dataclass
class CheckpointConfig(Section):
    """Sharded checkpoints (torch.distributed.checkpoint) under <run dir>/checkpoints/step_N. A run started
    again in the same run directory (the same command and hydra.run.dir, or a requeued SLURM job) resumes
    from the latest complete one, with identical results; a SIGTERM or submitit's preemption signal also
    saves one before the run stops. Every key is read by every run: keep_last and keep_when_completed act
    whenever a checkpoint is saved, periodically, and also on a stop signal or at train.time_limit_min with
    every_steps=0, which no check can foresee."""

    at = "checkpoint"

    every_steps: int = setting(50, accepted=AtLeast(0, "an integer >= 0 (0: no periodic checkpoints)"))
    """Save a sharded checkpoint every N optimizer steps (>= 0; 0: only when stopped by a signal or
    train.time_limit_min)."""
    keep_last: int | None = setting(2, accepted=AtLeast(1, "an integer >= 1, or null to keep all", null=True))
    """Complete checkpoints to keep (>= 1); older ones are deleted. null: keep all."""
    resume: bool = setting(True)
    """Resume from the run directory's latest checkpoint (false: start over, deleting them)."""
    keep_when_completed: bool = setting(False)
    """Keep the checkpoints of a run that completed (false: delete them; the model stays in model/)."""


# Each loss's dataclass by its name: dpo/losses/schema.py fills it from the loss registry when it is imported
# (as `import dpo_sweeps` does), since config/ imports nothing of the losses.
LOSS_SCHEMAS: dict[str, type] = {}


@dataclass
class Config(Section):
    """The whole task config a run receives (`hydra` is Hydra's own node, typed by Hydra)."""

    model: ModelConfig = MISSING
    """model=<conf/model file>: the network and its tokenizer."""
    data: Any = choices(DATA_SCHEMAS)
    """data=<conf/data file>: typed per source (data_schema.py: synthetic, hh, preference)."""
    loss: Any = choices(LOSS_SCHEMAS)
    """loss=<conf/loss file>: `name` and exactly that loss's hyperparameters, typed per loss (dpo/losses/schema.py)."""
    fsdp: FsdpConfig = MISSING
    """fsdp=<conf/fsdp file>: how parameters are sharded."""
    precision: PrecisionConfig = MISSING
    """precision=<conf/precision file>: compute and reduction dtypes."""
    peft: PeftConfig = field(default_factory=PeftConfig)
    """peft=<conf/peft file>: a full fine-tune (none) or LoRA adapters."""
    train: TrainConfig = field(default_factory=TrainConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    wandb: FormerWandbConfig = field(default_factory=FormerWandbConfig)
    """Former name of tracking.wandb, accepted for one release (RENAMED)."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterConfig | None = None
    """cluster=<conf/cluster file>: the hardware the sweep's cost is predicted on (dpo_sweeps/cost/);
    null: none (a run predicts its step on the device it gets)."""

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Config:
        """The frozen, typed Config of a resolved config (plain containers: what the Hydra task resolves,
        summary.json's `config`). A section the config lacks keeps the schema's default (the report reads
        summaries of every age; their plan needs only fsdp, precision and resources). Under DPO_SWEEPS_SMOKE=1
        the training is cut to a couple of steps (smoke.py)."""
        values = move_renamed(smoke_cut(values))
        return cls(**{f.name: cls.section(f.name, values[f.name]) for f in fields(cls)
                      if isinstance(values.get(f.name), Mapping)})

    @classmethod
    def section(cls, name: str, values: Mapping[str, Any] | None) -> Any:
        """One section of a resolved config, typed: `data` and `loss` by what they hold (BUILDERS)."""
        if values is None:  # a section a config may leave out (cluster)
            return None
        build = BUILDERS.get(name) or section_types(cls)[name].of
        return build(values)

    @property
    def world_size(self) -> int:
        return self.resources.world_size

    def check(self) -> None:
        """Each section's own checks, in the order a reader meets them; checks/validate.py adds those that span
        sections."""
        for section in (self.resources, self.train, self.loss, self.data, self.model, self.fsdp, self.precision,
                        self.peft, self.perf, self.probe, self.checkpoint, self.tracking, self.faults):
            section.check()
        if self.cluster is not None:
            self.cluster.check()


# The sections typed by what they hold, read from a resolved config by their own module's builder:
# `data` by its source's keys (data_schema.py); `loss` by its loss (dpo/losses/schema.py adds it on import,
# as `import dpo_sweeps` does).
BUILDERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {"data": data_config}

# Where each schema sits in the ConfigStore; the YAML files name these in their defaults lists.
ROOT_SCHEMA = "dpo_sweeps_schema"
GROUP_SCHEMAS: dict[str, dict[str, type]] = {"data": DATA_SCHEMAS}


def register() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent); conf/ refers to them by name. Also the
    settings listing `--help` shows (conf/config.yaml's hydra.help.template)."""
    register_settings_help(Config)
    store = ConfigStore.instance()
    store.store(name=ROOT_SCHEMA, node=Config)
    for group, schemas in GROUP_SCHEMAS.items():
        for name, node in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=node)
