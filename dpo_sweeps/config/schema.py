"""The typed schema of a dpo-sweeps config: one dataclass per section, a docstring under every field.

conf/ chooses values; these dataclasses say which keys exist, what type each has and what it does.
Hydra validates every composed config against them (conf/config.yaml's defaults list starts with
`dpo_sweeps_schema`; each group file starts with its own `/schema/<group>/...`), so an unknown key
(`train.lr_rate=1`) or a wrong type (`train.batch_size=abc`) is refused while the config is composed,
before anything runs. Range checks that need several keys at once are in validate.py.

`loss` is typed per loss, as `data` is per source: each loss has its own hyperparameters, so its
dataclass is made from the loss registry (dpo/losses/schema.py, `schema/loss/NAME`) and conf/config.yaml
types the chosen loss with it. `model.from_config` is a mapping: the transformers config of a model family.

This module imports only dataclasses, omegaconf and hydra: every process that composes a config
(the CLI, a sweep's job, a test) registers it by importing `dpo_sweeps`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from dpo_sweeps.config.data_schema import DATA_SCHEMAS


@dataclass
class TrainConfig:
    batch_size: int = MISSING
    """Global batch, in preference pairs, summed over all ranks and accumulation steps (>= 1)."""
    micro_batch_size: int = MISSING
    """Pairs per rank per forward pass; batch_size must be a multiple of micro_batch_size x ranks."""
    max_steps: int = MISSING
    """Optimizer steps to train (>= 1)."""
    lr: float = MISSING
    """Peak learning rate (> 0)."""
    optimizer: str = MISSING
    """adamw | rmsprop."""
    weight_decay: float = MISSING
    """The optimizer's decoupled (adamw) or L2 (rmsprop) weight decay (>= 0)."""
    warmup_steps: int = MISSING
    """Steps of linear warmup from 0, then constant, as the reference DPO implementation (>= 0)."""
    max_grad_norm: float | None = MISSING
    """Clip the global gradient norm to this (> 0); null: no clipping (grad_norm is still logged)."""
    eval_every: int = MISSING
    """Evaluate on the held-out pairs every N optimizer steps and at the end (>= 0; 0: only at the end)."""
    eval_max_pairs: int | None = MISSING
    """Cap on held-out pairs evaluated (>= 1); null: all."""
    log_every: int = MISSING
    """Write a metrics.jsonl row every N optimizer steps (>= 1)."""
    seed: int = MISSING
    """Seed of the model init, data order and dropout."""
    progress_bar: bool = MISSING
    """Show a progress bar on rank 0."""
    save_model: bool = MISSING
    """Save the final policy in Hugging Face format under <run dir>/model (rank 0 gathers it)."""
    time_limit_min: float | None = MISSING
    """Wall-time limit of one attempt, in minutes (> 0); when reached the run saves a checkpoint and
    ends failed with kind `timeout` (the same command resumes it). null: none."""
    precompute_reference_logps: bool = MISSING
    """Score every pair under the frozen reference once before training, cache the scores on disk
    ($DPO_SWEEPS_CACHE/reference_logps) and free the reference model. false: a reference forward per step."""
    logps_chunk_size: int = MISSING
    """Response log-probs from the LM head on response positions only, this many rows of logits at a
    time (>= 1): no [batch, length, vocab] fp32 logits. 0: full logits, as the reference DPO implementation."""
    share_prompt: bool = MISSING
    """One row per pair, prompt + chosen + rejected, the prompt computed once (needs logps_chunk_size > 0
    and sdpa or eager attention). false: chosen and rejected rows, [2 x batch, length]."""
    zero_shot_eval: bool = False
    """Before the first step, score the held-out pairs with the policy alone (log p(chosen) against
    log p(rejected), no reference): eval/zero_shot/{accuracy, margin, accuracy_ci95} in metrics.jsonl
    (step 0) and summary.json, the baseline beside eval/rewards/accuracies (train/zero_shot.py)."""
    sample_prompts: int = 0
    """> 0: after the final model is saved (needs save_model), rank 0 writes samples.json, the greedy
    replies to this many held-out prompts before and after training (train/samples.py). 0: none."""
    sample_max_new_tokens: int = 64
    """With sample_prompts: the longest reply generated, in tokens (>= 1)."""


@dataclass
class TokenizerConfig:
    kind: str = MISSING
    """byte: 256 byte tokens + specials; bpe: a byte-level BPE trained on the run's training text
    (cached); pretrained: AutoTokenizer.from_pretrained(model.name_or_path)."""
    vocab_size: int | None = MISSING
    """bpe only: the vocabulary size (> 258); null for byte and pretrained."""


@dataclass
class ModelConfig:
    name_or_path: str = MISSING
    """A hub model name or local folder for from_pretrained, or a label when from_config builds it."""
    block_name: str = MISSING
    """The transformer block class FSDP wraps, one FSDP unit per block (e.g. GPT2Block)."""
    init_from: str | None = MISSING
    """A run directory of an earlier run (e.g. loss=sft) whose saved model is the policy's start and
    the reference; null: name_or_path / from_config."""
    from_config: dict[str, Any] | None = MISSING
    """transformers config kwargs (model_type and its family's keys) of a random-init model;
    null: load name_or_path with from_pretrained."""
    tokenizer: TokenizerConfig = MISSING
    """How text becomes tokens."""
    gguf_file: str | None = None
    """A GGUF model file (any architecture transformers reads from GGUF) whose weights, tokenizer and
    chat template the run loads, or pkg://PACKAGE/FILE for a file inside an installed Python package
    (found without importing it). Dequantized once and cached as safetensors under
    $DPO_SWEEPS_CACHE/gguf/<content hash> (models/gguf.py). Needs from_config null and tokenizer.kind
    pretrained; null: name_or_path / from_config."""
    install_hint: str | None = None
    """How to get the model's files where they are missing (e.g. a pip command), shown in the error."""


@dataclass
class FsdpConfig:
    sharding_strategy: str = MISSING
    """full_shard | shard_grad_op | hybrid_shard | no_shard."""
    reshard_after_forward: bool = MISSING
    """Free the gathered parameters after forward and gather them again for backward (ZeRO-3)."""
    hybrid_group_size: int | None = MISSING
    """hybrid_shard: ranks per shard group (a divisor of the world size); null: the ranks of one node."""
    activation_checkpointing: bool = MISSING
    """Recompute each block's activations in backward instead of keeping them."""
    cpu_offload: bool = MISSING
    """Keep parameters, gradients and optimizer state in CPU memory (CUDA runs only)."""


@dataclass
class PrecisionConfig:
    name: str = MISSING
    """The conf/precision file's name: fp32 | bf16 | fp16. A run names its precision from the dtypes below
    (summary.json's plan); the report falls back on this name only for a run without a plan."""
    param_dtype: str = MISSING
    """Compute dtype of the sharded parameters: float32 | bfloat16 | float16."""
    reduce_dtype: str = MISSING
    """Dtype gradients are reduced in: float32 | bfloat16 | float16."""
    loss_scaling: bool = MISSING
    """Dynamic loss scaling (fp16); the skip-step decision is all-reduced so every rank steps together."""
    initial_loss_scale: float = 65536.0
    """With loss_scaling: the first loss scale (> 0)."""
    loss_scale_growth_interval: int = 200
    """With loss_scaling: steps without overflow before the scale doubles (>= 1)."""


@dataclass
class ResourcesConfig:
    nodes: int = MISSING
    """Nodes of the run (>= 1)."""
    nproc_per_node: int = MISSING
    """Ranks per node: GPUs per node, or CPU processes where there is no GPU (>= 1)."""
    device: str = MISSING
    """cpu | cuda | auto (cuda when available, decided on the job's node)."""
    master_port: int | None = MISSING
    """Rendezvous port for local ranks; null picks a free one and prints it."""
    device_memory_gib: float | None = MISSING
    """Memory of one device in GiB (> 0) for the fit check before a sweep launches; null: the CUDA
    device's memory when the run uses CUDA, no check on CPU."""
    collective_timeout_s: float = MISSING
    """Seconds a collective may wait before a rank gives up (a dead peer ends the run, never a hang)."""
    hang_timeout_s: float | None = MISSING
    """Seconds without progress (no training step phase, eval batch or checkpoint on any rank) after which
    the run ends failed with kind `hang`, naming the rank that held the others up (runtime/watchdog.py;
    watched from the first training step on) (> 0); null: collective_timeout_s."""
    threads_per_rank: int | None = MISSING
    """CPU threads per rank (>= 1); null: cores / local ranks."""
    bind_cores: bool = MISSING
    """Bind the CPU ranks dpo-sweeps starts itself each to its own block of the job's cores (torchrun and
    SLURM tasks are bound by their launcher, e.g. srun --cpu-bind; GPU ranks are not bound)."""


@dataclass
class PerfConfig:
    warmup_steps: int = MISSING
    """Steps ignored before timing starts (compilation, allocator warm-up) (>= 0)."""


@dataclass
class ProbeConfig:
    steps: int = MISSING
    """> 0: train only this many steps (the first perf.warmup_steps untimed) to measure speed and peak
    memory; no periodic eval, saved model, checkpoints or reference pass. 0: a normal run."""


# faults.kind's accepted values (besides null); train/faults.py injects them.
FAULT_KINDS = ("nan_loss", "crash", "oom", "sigkill", "hang", "sigkill_in_checkpoint")


@dataclass
class FaultsConfig:
    """Fault injection, for tests (train/faults.py): at optimizer step `step` on rank `rank`, `kind` happens:
    nan_loss (the loss becomes NaN), crash (an exception), oom (an out-of-memory error), sigkill (the rank
    process is killed), hang (the rank sleeps forever in the step), sigkill_in_checkpoint (the rank is
    killed inside the save of checkpoint `step`, its files written, before it is complete). Faults fire
    only in an attempt that started from step 0, so running the same command again shows the recovery."""

    kind: str | None = MISSING
    """For tests: null | nan_loss | crash | oom | sigkill | hang | sigkill_in_checkpoint (train/faults.py)."""
    step: int = MISSING
    """The optimizer step the fault fires at."""
    rank: int = MISSING
    """The rank it fires on."""


@dataclass
class CheckpointConfig:
    """Sharded checkpoints (torch.distributed.checkpoint) under <run dir>/checkpoints/step_N. A run started
    again in the same run directory (the same command and hydra.run.dir, or a requeued SLURM job) resumes
    from the latest complete one, with identical results; a SIGTERM or submitit's preemption signal also
    saves one before the run stops."""

    every_steps: int = MISSING
    """Save a sharded checkpoint every N optimizer steps (>= 0; 0: only when stopped by a signal or
    train.time_limit_min)."""
    keep_last: int | None = MISSING
    """Complete checkpoints to keep (>= 1); older ones are deleted. null: keep all."""
    resume: bool = MISSING
    """Resume from the run directory's latest checkpoint (false: start over, deleting them)."""
    keep_when_completed: bool = MISSING
    """Keep the checkpoints of a run that completed (false: delete them; the model stays in model/)."""


@dataclass
class WandbConfig:
    mode: str = MISSING
    """offline | online | disabled."""
    project: str = MISSING
    """The W&B project."""
    entity: str | None = MISSING
    """The W&B entity (team or user); null: W&B's default."""
    group: str | None = MISSING
    """The W&B group; null: the sweep directory's name for sweeps, the run name otherwise."""


@dataclass
class Config:
    """The whole task config a run receives (`hydra` is Hydra's own node, typed by Hydra)."""

    model: ModelConfig = MISSING
    """model=<conf/model file>: the network and its tokenizer."""
    data: Any = MISSING
    """data=<conf/data file>: typed per source (data_schema.py: synthetic, hh, preference)."""
    loss: Any = MISSING
    """loss=<conf/loss file>: `name` and exactly that loss's hyperparameters, typed per loss (dpo/losses/schema.py)."""
    fsdp: FsdpConfig = MISSING
    """fsdp=<conf/fsdp file>: how parameters are sharded."""
    precision: PrecisionConfig = MISSING
    """precision=<conf/precision file>: compute and reduction dtypes."""
    train: TrainConfig = field(default_factory=TrainConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


# Where each schema sits in the ConfigStore; the YAML files name these in their defaults lists.
ROOT_SCHEMA = "dpo_sweeps_schema"
GROUP_SCHEMAS: dict[str, dict[str, type]] = {"data": DATA_SCHEMAS}


def register() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent); conf/ refers to them by name."""
    store = ConfigStore.instance()
    store.store(name=ROOT_SCHEMA, node=Config)
    for group, schemas in GROUP_SCHEMAS.items():
        for name, node in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=node)
