"""Peak memory per device of a DPO run, estimated before it runs, from its shape.

From the parameter count and the model's dimensions, the run's parallel plan (plan.py: shard group,
reshard policy, compute dtype, offload, checkpointing), the micro-batch and sequence length, and the
speed/memory techniques. A sweep can rank or filter configs
with it before launching any; every run records it next to the measured peak
(`perf/peak_memory_estimate_gib` beside `perf/peak_memory_gib`), and bench/probe_vs_full.py prints
both for the quickstart grid.

Bytes per parameter follow ZeRO's accounting (Rajbhandari et al. 2020, arXiv 1910.02054, sec. 3.1):
fp32 master weights 4, fp32 gradients 4, AdamW moments 8, all divided by the shard group size; plus
the unsharded compute copies FSDP gathers (every block when parameters stay gathered after forward,
`reshard_after_forward` false as for shard_grad_op; else the root and about two blocks). Under CPU offload (`fsdp.cpu_offload`) the model states live in CPU memory
and only the gathered copies count. Activations per token and layer are counted as in Korthikanti
et al. 2022 (arXiv 2205.05198, sec. 4.1), for attention without a materialised score matrix (SDPA),
with the counts measured on the Hugging Face blocks (saved-tensor hooks, bench_gpt2): about 8 h
values for attention and norms and 5 i for the MLP (an activation written as several elementwise
ops, such as GPT-2's tanh GELU or a gated SiLU, saves several intermediate-sized tensors), plus the
[rows, 1, L, L] fp32 padding mask each layer's SDPA keeps (one boolean mask for all layers where rows are
prefix-shared or packed). Packed rows (`train.packing`) are counted at the longest pairs too, as many
to a row as `train.micro_batch_tokens` takes, each row as wide as that budget (ragged pairs can fill
it): fewer, wider rows, a larger mask. With activation checkpointing
(`fsdp.activation_checkpointing`) a block keeps only its input, and one block's activations exist at
a time, while backward recomputes it. Backward adds a few intermediate-sized gradients at once.
On a CPU the peak is the process's resident set, so the process's own resident memory before the
model exists (Python, libraries, the model's code, data) is added, plus what a torch CPU process gains
once it trains beyond the tensors counted here (thread pools, oneDNN primitive caches, gloo buffers:
CPU_RUNTIME, measured on the bench and quickstart runs), plus the freed memory the rank's malloc keeps
(`heap_kept`: tcmalloc's or glibc's heap, by resources.cpu_allocator and parallel/allocator.py).
Evaluation runs no backward, so its passes are sized to fit in what a training micro-batch holds
(`eval_batching`); a set train.eval_micro_batch_size that needs more adds the difference (`eval_excess`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dpo_sweeps.data.encoding import EvalBatching
from dpo_sweeps.data.rows import longest_rows_of
from dpo_sweeps.dpo.losses import uses_reference
from dpo_sweeps.parallel.allocator import run_allocator
from dpo_sweeps.parallel.plan import DTYPES, ParallelPlan

GIB = 1024**3
OPTIMIZER_STATE_BYTES = {"adamw": 8, "rmsprop": 4}
# What a training torch CPU process gains beyond its tensors once it has built a model and stepped, the
# model's code already imported and so in the baseline (models/build.py load_model_code): the process
# group, autograd and kernel pages, thread pools (fitted to the probes of bench/memory_estimate_error.py:
# bench/README.md).
CPU_RUNTIME = 56 * 2**20
# glibc serves an allocation this large or larger by mmap whatever its dynamic threshold has risen to
# (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, mallopt(3)), and unmaps it when freed: it never stays in the heap.
MMAP_THRESHOLD_MAX = 32 * 2**20
# peft=qlora (models/quantize.py): a 4-bit weight packs two to a byte, and bitsandbytes keeps one fp32
# scale (absmax) per block of 64 weights; with double_quant the scales are 8-bit, plus an fp32 per 256 of them.
QUANT_BLOCK = 64


@dataclass(frozen=True)
class ModelShape:
    num_params: int
    num_layers: int
    hidden: int
    intermediate: int
    vocab: int
    trainable_params: int | None = None  # those that get gradients and optimizer state; None: all (full fine-tune)
    quantized_params: int = 0  # peft=qlora: the base weights stored in 4-bit (the linear layers of the blocks)
    double_quant: bool = False  # peft.double_quant: their scales in 8-bit
    trained_tensors: int = 0  # parameter tensors the optimizer steps (0: not counted)

    @classmethod
    def of(cls, model) -> ModelShape:
        """From a Hugging Face causal LM (its config and parameter count; with adapters, the trained share)."""
        c = model.config
        hidden = c.hidden_size
        intermediate = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * hidden
        params = list(model.parameters())
        trainable = sum(p.numel() for p in params if p.requires_grad)
        total = sum(p.numel() for p in params)
        return cls(total, c.num_hidden_layers, hidden, intermediate, c.vocab_size,
                   trainable if trainable < total else None,
                   trained_tensors=sum(1 for p in params if p.requires_grad))

    @property
    def trained(self) -> int:
        return self.num_params if self.trainable_params is None else self.trainable_params

    @property
    def quantized_bytes(self) -> int:
        """The 4-bit weights, packed (sharded like any parameter)."""
        return self.quantized_params // 2

    @property
    def scale_bytes(self) -> int:
        """The 4-bit weights' quantization constants (every rank holds them whole)."""
        blocks = self.quantized_params // QUANT_BLOCK
        return blocks + 4 * (blocks // 256) if self.double_quant else 4 * blocks

    @property
    def block_params(self) -> int:
        return (self.num_params - self.root_params) // max(1, self.num_layers)

    @property
    def root_params(self) -> int:
        """Embeddings and output head (tied or not, at least one vocab x hidden matrix), outside the blocks."""
        return min(self.num_params, self.vocab * self.hidden)


@dataclass(frozen=True)
class RunShape:
    shard_group_size: int  # ranks a parameter is sharded over (1 for no_shard)
    param_dtype: str  # the compute dtype (a name of plan.DTYPES)
    optimizer: str
    micro_batch_size: int  # pairs per forward pass
    seq_len: int  # padded length of a row (before a run: data/rows.py's longest_rows)
    uses_reference: bool = True
    precompute_reference_logps: bool = False
    logps_chunk_size: int = 0  # 0: full [rows, L, V] logits
    share_prompt: bool = False
    packing: bool = False  # train.packing: rows of whole pairs under one dense boolean mask (data/packing.py)
    row_tokens: int | None = None  # train.micro_batch_tokens: a packed row's budget (None: one pair a row)
    response_fraction: float = 0.5  # share of a row's tokens that are response tokens (scored)
    cpu_offload: bool = False  # fsdp.cpu_offload: parameter shards, gradients and optimizer state in CPU memory
    activation_checkpointing: bool = False  # each block keeps only its input; backward recomputes one at a time
    reshard_after_forward: bool = True  # false: the trained model's blocks stay gathered from forward to backward
    reduce_dtype: str = "float32"  # the dtype gradients are reduce-scattered in
    fully_sharded: bool = True  # the trained model is wrapped by fully_shard (fsdp.needs_fully_shard)
    adapters: bool = False  # peft: the reference is the policy with its adapters off (models/adapters.py)
    allocator: str = "glibc"  # CPU: the malloc the rank runs with (resources.cpu_allocator, parallel/allocator.py)
    eval_micro_batch_size: int | None = None  # held-out pairs a no-grad pass; None: as many as fit (eval_batching)


@dataclass
class MemoryEstimate:
    model_states: int  # master weights, gradients, optimizer moments (sharded)
    gathered_params: int  # unsharded compute copies FSDP holds at the peak
    reference: int
    activations: int
    logits: int
    baseline: int  # CPU: the process's resident memory before the model existed, plus CPU_RUNTIME
    total: int
    heap_kept: int = 0  # CPU: freed step buffers glibc's heap keeps resident (heap_kept)
    eval_excess: int = 0  # what an eval pass of train.eval_micro_batch_size holds beyond a training micro-batch


def model_states(model: ModelShape, run: RunShape) -> int:
    """fp32 master weights, fp32 gradients and the optimizer's moments, sharded (ZeRO, sec. 3.1). Under CPU
    offload they live in CPU memory, not on the device."""
    if run.cpu_offload:
        return 0
    # Frozen parameters (the base under adapters) hold their fp32 weights only: no gradient, no moments;
    # under peft=qlora the blocks' linear weights are 4-bit, and their scales are not sharded.
    per_trained = 4 + OPTIMIZER_STATE_BYTES.get(run.optimizer, 8)
    weights = 4 * (model.num_params - model.quantized_params) + model.quantized_bytes
    return (weights + per_trained * model.trained) // max(1, run.shard_group_size) + model.scale_bytes


def gathered_params(model: ModelShape, run: RunShape) -> int:
    """The unsharded compute copies FSDP holds: every block kept gathered from forward to backward, or the
    root plus the block in use and the next one when resharded after forward. None without fully_shard
    (one fp32 rank): the model computes with its own weights, counted in the model states."""
    if not run.fully_sharded:
        return 0
    pb = DTYPES[run.param_dtype].bytes
    packed_per_block = model.quantized_bytes // max(1, model.num_layers)  # 4-bit weights gather packed
    unpacked_per_block = model.quantized_params // max(1, model.num_layers)
    if not run.reshard_after_forward:
        return pb * (model.num_params - model.quantized_params) + model.quantized_bytes
    return pb * (model.root_params + 2 * (model.block_params - unpacked_per_block)) + 2 * packed_per_block


def reference(model: ModelShape, run: RunShape) -> int:
    """A reference model run in every step (not precomputed): its shard and the blocks it gathers."""
    if not run.uses_reference or run.precompute_reference_logps or run.adapters:
        return 0  # with adapters the reference is the policy with them off: no model of its own
    pb = DTYPES[run.param_dtype].bytes
    shard = 0 if run.cpu_offload else pb * model.num_params // max(1, run.shard_group_size)
    return shard + pb * 2 * model.block_params


def activations(model: ModelShape, run: RunShape) -> int:
    """Saved activations (Korthikanti et al. 2022, sec. 4.1; counts measured on the Hugging Face blocks):
    8 h + 5 i values per token and layer, the padding masks, and backward's working gradients."""
    pb = DTYPES[run.param_dtype].bytes
    rows, width = _row_layout(run)
    tokens = rows * width
    # A checkpointed block saves only its input; its own activations exist for one block at a time, in backward.
    saving_layers = 1 if run.activation_checkpointing else model.num_layers
    total = tokens * saving_layers * (8 * model.hidden + 5 * model.intermediate) * pb
    if run.activation_checkpointing:
        total += tokens * model.num_layers * model.hidden * pb
    total += tokens * model.hidden * pb * 2  # embeddings output and final norm
    total += 4 * tokens * model.intermediate * pb  # backward's working gradients
    if run.share_prompt or run.packing:
        total += rows * width * width  # one 4-D boolean mask, shared by the layers
    else:
        total += saving_layers * rows * width * width * 4  # per-layer fp32 padding mask
    return total


def logits(model: ModelShape, run: RunShape) -> int:
    """The LM head's output: [rows, L, V] logits, their fp32 log-softmax and its gradient; or, chunked
    (train.logps_chunk_size), the scored positions' hidden states and three fp32 chunks of logits."""
    pb = DTYPES[run.param_dtype].bytes
    rows, width = _row_layout(run)
    tokens = rows * width
    if run.logps_chunk_size:
        scored = int(tokens * run.response_fraction)
        return scored * model.hidden * pb + 3 * min(run.logps_chunk_size, scored) * model.vocab * 4
    return tokens * model.vocab * (pb + 4 + 4 + (4 if pb != 4 else 0))


def _rows(run: RunShape) -> int:
    """Rows of a padded micro-batch: chosen and rejected each, or one prefix-shared row per pair."""
    return run.micro_batch_size * (1 if run.share_prompt else 2)


def _row_layout(run: RunShape) -> tuple[int, int]:
    """(rows, width) of a micro-batch of rows `seq_len` long: padded, or packed (train.packing) as many to a
    row as the budget takes, so fewer and wider rows, whose mask grows with the width squared.

    Packed, a micro-batch holds at most ceil(units / per_row) rows whatever the pairs' lengths (first-fit
    decreasing opens a row only when every open one holds per_row segments or more, and a step's rows are
    dealt evenly over its micro-batches: data/packing.py `step_micro_batches`), but ragged pairs can fill
    each of them to the budget, so the rows are counted at the budget's width, not at per_row pairs'."""
    units = _rows(run)
    if not run.packing or run.row_tokens is None:
        return units, run.seq_len
    per_row = max(1, min(units, run.row_tokens // max(1, run.seq_len)))
    return -(-units // per_row), max(run.row_tokens, run.seq_len)


def training_pass(model: ModelShape, run: RunShape) -> int:
    """What a training micro-batch's forward and backward hold beyond the model: activations and logits."""
    return activations(model, run) + logits(model, run)


def eval_pass(model: ModelShape, run: RunShape, tokens: int) -> int:
    """What a no-grad forward over `tokens` tokens of padded rows holds at its peak. Nothing is saved for a
    backward, so only one block's working tensors exist at a time (queries, keys, values, the attention
    output and the residual stream: about 6 h; the MLP's input, gate and activation: about 3 i), the hidden
    states entering and leaving it, the padding mask, and the LM head's output without its gradient."""
    pb = DTYPES[run.param_dtype].bytes
    block = tokens * (6 * model.hidden + 3 * model.intermediate) * pb + 2 * tokens * model.hidden * pb
    dense = run.share_prompt or run.packing
    mask = tokens * _row_layout(run)[1] * (1 if dense else 4)  # [rows, 1, L, L]: bool shared or packed, else fp32
    if run.logps_chunk_size:
        scored = int(tokens * run.response_fraction)
        head = scored * model.hidden * pb + 2 * min(run.logps_chunk_size, scored) * model.vocab * 4
    else:
        head = tokens * model.vocab * (pb + 4 + (4 if pb != 4 else 0))
    return block + mask + head


def eval_batching(model: ModelShape, run: RunShape) -> EvalBatching:
    """How held-out pairs are batched for eval (data/encoding.py eval_micro_batch_indices). A set
    train.eval_micro_batch_size is a cap on pairs a pass. Left null, a pass takes as many tokens as fit in
    what a training micro-batch holds for its backward (`training_pass`): a no-grad forward saves nothing,
    so several times the pairs fit in the memory training already peaks at, and the estimate's peak holds."""
    if run.eval_micro_batch_size is not None:
        return EvalBatching(max_pairs=run.eval_micro_batch_size)
    rows, width = _row_layout(run)
    limit, low = training_pass(model, run), rows * width  # a training micro-batch's rows fit
    high = 1024 * low
    while low < high:  # eval_pass grows with the tokens: the most that stay within the limit
        middle = (low + high + 1) // 2
        low, high = (middle, high) if eval_pass(model, run, middle) <= limit else (low, middle - 1)
    return EvalBatching(max_pairs=None, max_tokens=low)


def eval_excess(model: ModelShape, run: RunShape) -> int:
    """What a held-out pass of train.eval_micro_batch_size pairs (at the longest row) holds beyond a training
    micro-batch's forward and backward: the peak then rises by it. 0 for the derived size (eval_batching)."""
    if run.eval_micro_batch_size is None:
        return 0
    rows, width = _row_layout(dataclasses.replace(run, micro_batch_size=run.eval_micro_batch_size))
    tokens = rows * width
    return max(0, eval_pass(model, run, tokens) - training_pass(model, run))


def heap_kept(model: ModelShape, run: RunShape) -> int:
    """Bytes of the buffers a CPU training step allocates and frees that the malloc keeps resident: glibc's
    heap, as below; under tcmalloc, `tcmalloc_kept`.

    glibc serves a large allocation by mmap, and returns it to the system when freed, only until the
    first such block is freed: then its mmap threshold rises to that size (dynamic threshold, mallopt(3))
    and later tensors up to it come from the heap, which keeps freed memory for reuse. A freed buffer's
    hole stays resident when tensors allocated after it land inside it, so that the next buffer of its
    size takes fresh heap. Counted once each (measured per phase and per block on SmolLM2 and the toy
    models: bench/README.md): the optimizer's temporary (AdamW's foreach step computes one fp32
    shard-sized tensor); and, per fully_shard unit, the gathers split by activations (`_split_gathers`)
    and, in backward, the unsharded gradients and the unsharded parameters, both in the compute dtype,
    freed while the activation gradient passed to the next block sits between them. The flat
    reduce-scatter input (reduce dtype) is allocated and freed with nothing kept in between, and the next
    block's takes its place: in bf16 the heap kept half of fp32's, though gradients are reduced in fp32.
    Buffers of MMAP_THRESHOLD_MAX or more are always mmapped and given back (SmolLM2's 49,152 x 576
    embedding), so only units below it count. A rank fully_shard does not wrap gathers nothing, and keeps
    its activations' holes instead (`_activation_holes`). Fixing the threshold (MALLOC_MMAP_THRESHOLD_)
    returns all of this but makes a CPU step slower (every large tensor then page-faults in afresh):
    bench/README.md. Where those holes land varies from run to run, and so does a two-rank fp32 peak;
    tcmalloc keeps less, the same each run (parallel/allocator.py).
    """
    if run.allocator != "glibc":
        return tcmalloc_kept(model, run)
    s = max(1, run.shard_group_size)
    units = [model.root_params] + [model.block_params] * model.num_layers  # FSDP units: the root, one per block
    # The optimizer step's fp32 temporary is the size of what it steps: with adapters (peft), theirs only,
    # which live in the blocks.
    stepped = units if model.trainable_params is None else \
        [0] + [model.trainable_params // max(1, model.num_layers)] * model.num_layers
    optimizer_temporary = sum(_heap_sized(4 * u // s) for u in stepped)
    if not run.fully_sharded:
        # The optimizer steps after backward has freed the activations, in their holes: the larger is kept.
        return max(optimizer_temporary, _activation_holes(model, run))
    pb = DTYPES[run.param_dtype].bytes
    return optimizer_temporary + sum((_split_gathers(run) + 2) * _heap_sized(pb * u) for u in units)


def tcmalloc_kept(model: ModelShape, run: RunShape) -> int:
    """What tcmalloc holds free at the peak (resources.cpu_allocator=tcmalloc): freed spans its page heap
    has not yet given back, fitted to SmolLM2's peaks (bench/README.md). On a rank fully_shard wraps, whose
    gathered blocks come and go block by block, half a copy of the blocks' parameters in fp32 (10 shapes
    with adapters); and half the optimizer step's fp32 temporary, the size of the shard it steps (the
    full fine-tune's 8 shapes; with adapters it is theirs, small). On a rank fully_shard does not wrap the
    activations' freed spans are taken again by the next micro-batch: only the temporary's half counts."""
    gathers = 2 * model.block_params * model.num_layers if run.fully_sharded else 0
    return gathers + 2 * model.trained // max(1, run.shard_group_size)


def _activation_holes(model: ModelShape, run: RunShape) -> int:
    """What the heap keeps of a pass's activations on a rank that fully_shard does not wrap: one more
    forward's worth, every block's activations (saved, or freed at the block's end when checkpointed) and
    the head's logits. With no gathered blocks to take the activations, each block's freed buffers are split
    by the small tensors allocated among them (a checkpointed block's saved input, autograd's and the
    adapters' gradients), and the next micro-batch's activations take fresh heap (measured block by block
    on SmolLM2 with adapters on one rank: bench/README.md)."""
    every_block = dataclasses.replace(run, activation_checkpointing=False)
    return activations(model, every_block) + logits(model, run)


def _split_gathers(run: RunShape) -> int:
    """Passes in which a unit's flat all-gather output, freed once its parameters are copied out, is split
    by the activations the unit then saves, so the next unit's gather takes fresh heap (measured block by
    block on SmolLM2: the heap grew by one gathered block per block): the forward, and backward's regather
    when resharded after forward. A shard group of one gathers nothing (FSDP2 copies the shard into the
    unsharded parameter).

    A checkpointed forward saves only each block's output, and that still splits an fp32 gather's hole
    (measured on SmolLM2 and bench_gpt2, fp32: one gathered block per block). A gather that casts (bf16
    compute) also frees the cast shards, a smaller hole the saved output takes first, and the gather's
    own hole stays whole for the next block (bf16: the heap barely grew; SmolLM2 bf16 mb16 within 1%)."""
    if run.shard_group_size <= 1:
        return 0
    gather_casts = run.param_dtype != "float32"  # the parameters, not the gradients (unlike ParallelPlan.casts)
    forward = 0 if run.activation_checkpointing and gather_casts else 1
    return forward + (1 if run.reshard_after_forward else 0)


def _heap_sized(nbytes: int) -> int:
    """`nbytes` if glibc serves a buffer of that size from its heap, else 0 (mmapped, returned when freed)."""
    return nbytes if nbytes < MMAP_THRESHOLD_MAX else 0


def estimate_peak_memory(model: ModelShape, run: RunShape, baseline_bytes: int = 0,
                         runtime_resident: bool = False) -> MemoryEstimate:
    """Estimated peak bytes on the busiest device (see the module docstring for the accounting).

    `baseline_bytes`: on a CPU, the process's resident memory before the model was built (CPU_RUNTIME
    is added to it, unless `runtime_resident`: the process trained before, so its runtime is in the
    baseline); 0 on a GPU, whose allocator counts tensors only.
    """
    terms = (model_states(model, run), gathered_params(model, run), reference(model, run),
             activations(model, run), logits(model, run))
    # A process that trained before (a probe batch's later runs) holds its runtime in the baseline already.
    baseline = baseline_bytes + (0 if runtime_resident else CPU_RUNTIME) if baseline_bytes else 0
    kept = heap_kept(model, run) if baseline_bytes else 0
    excess = eval_excess(model, run)
    return MemoryEstimate(*terms, baseline, sum(terms) + baseline + kept + excess, kept, excess)


def run_shape_of(cfg, plan: ParallelPlan, seq_len: int | None = None, response_fraction: float = 0.5,
                 allocator: str | None = None) -> RunShape:
    """The RunShape of a resolved dpo-sweeps config and its parallel plan (plan.resolve_plan): of the rows a run
    saw (`seq_len`, the longest, and the share of response tokens), or before it runs of pairs as long as
    truncation leaves them (data/rows.py, as the cost prediction takes them). `allocator`: the one the rank
    runs with (allocator.allocator_in_use), else the one the config picks on this machine."""
    train = cfg.train
    if seq_len is None:
        longest = longest_rows_of(cfg)
        seq_len, response_fraction = longest.length, longest.response_fraction
    return RunShape(
        shard_group_size=plan.shard_size, param_dtype=plan.param_dtype,
        reshard_after_forward=plan.reshard_after_forward, cpu_offload=plan.cpu_offload,
        reduce_dtype=plan.reduce_dtype,
        # as fsdp.needs_fully_shard decides for the trained model
        fully_sharded=plan.fully_sharded,
        activation_checkpointing=plan.activation_checkpointing,
        optimizer=train.optimizer, micro_batch_size=train.micro_batch_size,
        seq_len=seq_len,
        uses_reference=uses_reference(cfg.loss),
        precompute_reference_logps=train.precompute_reference_logps,
        logps_chunk_size=train.logps_chunk_size, share_prompt=train.share_prompt, packing=train.packing,
        row_tokens=train.micro_batch_tokens,
        response_fraction=response_fraction, adapters=plan.adapters is not None,
        allocator=allocator or run_allocator(cfg.resources),
        eval_micro_batch_size=train.eval_micro_batch_size,
    )
