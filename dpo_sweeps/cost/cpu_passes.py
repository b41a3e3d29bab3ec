"""cluster=cpu: a point's own passes, timed on this CPU at its shapes.

On a GPU the step's pieces run near rates a calibration can know. On a CPU the rate of a small model's
matmuls, attention and elementwise work changes with every shape (what fits the caches, the kernels
oneDNN picks, the hand-offs between a rank's threads), and a rate read off square matmuls misses the
step by a factor (bench/README.md). So cluster=cpu profiles each point at its shapes, as vTrain profiles
operators on GPUs: its architecture itself, built with 1 and with 3 blocks (random weights: the time does
not depend on their values), in its compute dtype, with its adapters, scores one micro-batch of its
longest pairs (data_lengths.py's longest_micro_batch) through the step's own code, collated as a run collates
them (data/collate.py: padding, a prefix-shared batch's 4-D mask; under train.packing data/packing.py's
packed rows and their dense [R, 1, L, L] mask) and scored by dpo/response_logps.py
(the LM head on the response positions or full logits), on the threads a rank gets:
- one block's training pass, (T3 - T1) / 2, forward and backward (weight gradients of what trains only;
  with activation checkpointing, as a run wraps it, the recompute too), and its forward without autograd
  (the reference's pass when not cached);
- the rest of the pass, T1 less one block: the micro-batch's collation (a run's step collates each one),
  embeddings, final norm, the LM head and log-softmax.
step_time.py adds what these passes do not hold from the machine's profile (cpu_profile.py): FSDP's
collectives, the optimizer, QLoRA's unpacking, the loss. Cached per shape under
$DPO_SWEEPS_CACHE/cluster/passes.

A forecast of the run's own data (predict.py) also times a few of the micro-batches its run will build
(`PassShape.lengths`: their pairs' exact token counts, data_lengths.py) and interpolates between them.
Each timing records the load it was taken under (load.py): one taken on a busy machine is cached as
provisional and taken again at the next quiet chance (`timed_passes`); a run whose step fell outside its
predicted interval marks the timings it used for re-timing (`mark_for_retiming`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace

from dpo_sweeps.cost.load import Load, LoadWatch, busy_now
from dpo_sweeps.rundir.atomic import write_json_atomic
from dpo_sweeps.rundir.paths import cache_root


@dataclass(frozen=True)
class MeasuredPasses:
    """One micro-batch's passes on one rank, in seconds."""

    block_train_s: float  # one block, forward and backward
    block_forward_s: float  # one block, forward without autograd
    rest_train_s: float  # all but the blocks (collation, embeddings, final norm, LM head, log-softmax), fwd and bwd
    rest_forward_s: float


@dataclass(frozen=True)
class PassShape:
    """What decides a point's passes (hashable: points of a sweep share them)."""

    architecture: str  # parallel/fit.py's architecture key, as JSON
    peft: str  # parallel/fit.py's peft key ("none" for a full fine-tune)
    dtype: str  # the compute dtype's torch name
    pairs: int  # train.micro_batch_size
    prompt: int  # tokens of each prompt (data.max_prompt_length)
    response: int  # tokens of each response (data.max_length - data.max_prompt_length)
    share_prompt: bool
    chunk_size: int  # train.logps_chunk_size (0: full logits)
    checkpointing: bool  # fsdp.activation_checkpointing: backward recomputes each block's forward
    threads: int
    # A micro-batch of the run's own data: (prompt, chosen, rejected) tokens of each pair, collated as the run
    # collates them; empty: `pairs` pairs at their longest (prompt, response).
    lengths: tuple[tuple[int, int, int], ...] = ()
    packing: bool = False  # train.packing: the pairs packed into rows (data/packing.py collate_packed)
    # Packed: the rows' budget (train.micro_batch_tokens, or for `lengths` the one the run resolves for them);
    # None: the widest row one of the pairs takes.
    row_tokens: int | None = None

    def cache_file(self):
        import torch

        fields = asdict(self)
        if not self.packing:  # a padded shape keeps the key it had before packing existed: its timings stay
            del fields["packing"], fields["row_tokens"]
        digest = hashlib.sha256(json.dumps([fields, torch.__version__, CACHE_VERSION]).encode()).hexdigest()[:20]
        return cache_root() / "cluster" / "passes" / f"{digest}.json"


def pass_shape(cfg, plan, threads: int) -> PassShape:
    from dpo_sweeps.parallel.fit import architecture_key, peft_key

    data, train = cfg.data, cfg.train
    return PassShape(architecture=json.dumps(architecture_key(cfg.model)),
                     peft=peft_key(cfg) if cfg.peft.method != "none" else "none", dtype=plan.param_dtype,
                     pairs=train.micro_batch_size, prompt=data.max_prompt_length,
                     response=data.max_length - data.max_prompt_length, share_prompt=train.share_prompt,
                     chunk_size=train.logps_chunk_size, checkpointing=plan.activation_checkpointing,
                     threads=threads, packing=train.packing, row_tokens=train.micro_batch_tokens)


CACHE_VERSION = 3  # of a cached timing: 2 records the load it was taken under; 3 times the collation too


@dataclass(frozen=True)
class PassTiming:
    """A shape's timed passes and the load they were taken under."""

    passes: MeasuredPasses
    load: Load | None  # None: unknown
    retime: bool = False  # a run disagreed with a forecast that used it: take it again

    @property
    def provisional(self) -> bool:
        """Taken on a busy machine (or doubted by a run): used for want of better, re-taken when quiet."""
        return self.load is None or not self.load.quiet or self.retime

    def as_dict(self) -> dict:
        return {"passes": asdict(self.passes), "load": self.load.as_dict() if self.load else None,
                "retime": self.retime, "taken_at": time.time()}


def cached_timing(shape: PassShape) -> PassTiming | None:
    try:
        found = json.loads(shape.cache_file().read_text())
        return PassTiming(MeasuredPasses(**found["passes"]), Load.of(found.get("load")), bool(found.get("retime")))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def cached_passes(shape: PassShape) -> MeasuredPasses | None:
    found = cached_timing(shape)
    return found.passes if found is not None else None


def timed_passes(shape: PassShape) -> PassTiming:
    """The passes of `shape`: a quiet cached timing; else timed now and cached. A provisional one is taken
    again only when the machine is quiet now; the faster of the two is kept, quiet only if the new one is."""
    found = cached_timing(shape)
    if found is not None and not found.provisional:
        return found
    if found is not None and not busy_now().quiet:
        return found  # still busy: the next quiet chance re-takes it
    new = time_passes(shape)
    if found is not None and not new.load.quiet and _total(found.passes) < _total(new.passes):
        new = replace(found, retime=False)  # both busy: the faster waited less
    try:
        write_json_atomic(shape.cache_file(), new.as_dict())
    except OSError:
        pass  # timed again next time
    return new


def measured_passes(shape: PassShape) -> MeasuredPasses:
    """The passes of `shape`: cached, or timed now (seconds) and cached (`timed_passes`)."""
    return timed_passes(shape).passes


def mark_for_retiming(shapes) -> int:
    """Mark the cached timings of `shapes` to be taken again at the next forecast; how many are so marked
    (marked now, or already by an earlier run)."""
    marked = 0
    for shape in set(shapes):
        found = cached_timing(shape)
        if found is None:
            continue
        if not found.retime:
            try:
                write_json_atomic(shape.cache_file(), replace(found, retime=True).as_dict())
            except OSError:
                continue
        marked += 1
    return marked


def _total(p: MeasuredPasses) -> float:
    return p.block_train_s + p.rest_train_s


def time_passes(shape: PassShape) -> PassTiming:
    """Time the passes of `shape` now (seconds), with the load they were taken under."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(shape.threads)
    try:
        with torch.random.fork_rng(), LoadWatch() as watch:
            (one_train, three_train), (one_forward, three_forward), rounds = _alternating(
                [_passes(shape, blocks) for blocks in (1, 3)])
    finally:
        torch.set_num_threads(before)
    block_train, block_forward = (three_train - one_train) / 2, (three_forward - one_forward) / 2
    passes = MeasuredPasses(block_train_s=max(block_train, 0.0), block_forward_s=max(block_forward, 0.0),
                            rest_train_s=max(one_train - block_train, 0.0),
                            rest_forward_s=max(one_forward - block_forward, 0.0))
    return PassTiming(passes, watch.load(rounds))


ROUNDS = (5, 20)  # at least, at most
BUDGET_S = 6.0


def _alternating(models: list[tuple]) -> tuple[list[float], list[float], list[float]]:
    """The median (training pass, forward) of each model, timed in alternating rounds until BUDGET_S is
    spent: a block's time is a difference of two such times, times the model's blocks, so both must see
    the same machine (warm caches and heap, no process passing by on one and not the other). The median,
    as a run's perf/step_time_s is its timed steps' median: the fastest round is a moment the run's steps
    are seldom as fast as (a small model's passes vary from one second to the next on a quiet machine);
    rounds that waited for another process's cores make the timing provisional (load.py)."""
    import statistics
    import time

    taken: list[list[list[float]]] = [[[] for _ in models] for _ in range(2)]
    for fns in models:  # warm-up: first calls fault their pages in and pick their kernels
        for fn in fns:
            fn()
    spent, rounds, round_times = 0.0, 0, []
    while rounds < ROUNDS[0] or (spent < BUDGET_S and rounds < ROUNDS[1]):
        round_start = spent
        for i, fns in enumerate(models):
            for kind, fn in enumerate(fns):
                start = time.perf_counter()
                fn()
                took = time.perf_counter() - start
                taken[kind][i].append(took)
                spent += took
        rounds += 1
        round_times.append(spent - round_start)  # the spread of these says whether rounds waited for cores
    return [statistics.median(t) for t in taken[0]], [statistics.median(t) for t in taken[1]], round_times


def _model(shape: PassShape, blocks: int):
    """The architecture with `blocks` blocks, its adapters, in the compute dtype, in training mode."""
    import torch
    from transformers import AutoModelForCausalLM

    from dpo_sweeps.parallel.fit import architecture_config

    config = copy.deepcopy(architecture_config(tuple(json.loads(shape.architecture))))
    config.num_hidden_layers = blocks
    if isinstance(getattr(config, "layer_types", None), list):  # per-block attention kinds (sliding, full)
        config.layer_types = config.layer_types[:blocks]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if shape.peft != "none":
        from dpo_sweeps.config.schema import PeftConfig
        from dpo_sweeps.models.adapters import add_adapters

        spec = json.loads(shape.peft)
        # QLoRA's base is timed as LoRA's: its unpacking is counted from bytes (step_time.py).
        peft = PeftConfig(**{**spec["peft"], "method": "lora"})
        model = add_adapters(model, peft, spec["block_name"])
    if shape.checkpointing:  # as parallel/fsdp.py wraps a trained model
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(getattr(torch, shape.dtype)).train()


def micro_batch(shape: PassShape, vocab: int) -> dict:
    """One micro-batch of `shape.pairs` pairs at their longest, collated as a run collates them; the last
    pair's rejected response a quarter shorter, so that the batch is padded as real ones are. With
    `shape.lengths`: pairs of exactly those token counts (a micro-batch of the run's own data). Packed
    (`shape.packing`): the rows collate_packed builds of them under `shape.row_tokens`."""
    return collated(shape, micro_batch_pairs(shape, vocab))


def micro_batch_pairs(shape: PassShape, vocab: int) -> list:
    """The pairs of `micro_batch` (random tokens), before collation."""
    import torch

    from dpo_sweeps.data.encoding import EncodedPair

    def tokens(n: int) -> list[int]:
        return torch.randint(1, vocab, (n,)).tolist()

    if shape.lengths:
        return [EncodedPair(tokens(p), tokens(c), tokens(r)) for p, c, r in shape.lengths]
    pairs = [EncodedPair(tokens(shape.prompt), tokens(shape.response), tokens(shape.response))
             for _ in range(shape.pairs)]
    pairs[-1] = EncodedPair(pairs[-1].prompt, pairs[-1].chosen, pairs[-1].rejected[: max(1, 3 * shape.response // 4)])
    return pairs


def collated(shape: PassShape, pairs: list) -> dict:
    """`pairs` collated as a run of `shape` collates them (train/scoring.py collate_pairs)."""
    from dpo_sweeps.data.collate import collate
    from dpo_sweeps.data.packing import collate_packed, widest_segment

    if shape.packing:
        # As data_lengths.py's packed_row_tokens: a set budget narrower than a pair is widened to it.
        budget = max(shape.row_tokens or 0, widest_segment(pairs, share_prompt=shape.share_prompt))
        return collate_packed(pairs, pad_id=0, row_tokens=budget, share_prompt=shape.share_prompt)
    return collate(pairs, pad_id=0, share_prompt=shape.share_prompt)


def _passes(shape: PassShape, blocks: int) -> tuple:
    """(training pass, forward alone) of the step's scoring of one micro-batch with `blocks` blocks."""
    import torch

    from dpo_sweeps.dpo.response_logps import response_logps

    model = _model(shape, blocks)
    pairs = micro_batch_pairs(shape, model.config.vocab_size)
    batch = collated(shape, pairs)
    params = [p for p in model.parameters() if p.requires_grad]

    def train() -> None:  # collates, as a run's step does for each micro-batch: in the rest of the pass
        response_logps(model, collated(shape, pairs), shape.chunk_size).sums.sum().backward()
        for p in params:
            p.grad = None

    def forward() -> None:
        with torch.no_grad():
            response_logps(model, batch, shape.chunk_size)

    return train, forward
