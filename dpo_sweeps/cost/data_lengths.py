"""The lengths of a run's own pairs, and the micro-batches its collator will build from them.

The worst case (every row at data.max_length, data/rows.py) is what the memory estimate must assume; a
step's expected time is not: preference data is ragged (most HH responses are a few dozen tokens), and a
run pads each micro-batch to its own longest row only (data/collate.py). So the forecast reads a seeded
sample of the run's training pairs with the run's own readers and tokenizer (data/sources.py,
models/build.py, data/encoding.py: truncation included), orders it with the run's sampler
(GlobalBatchSampler: data.length_grouped, its window) and cuts each global batch as the ranks do
(rank_micro_batch_indices). What comes out is, for each simulated step, each micro-batch's rows on each
rank: their number, padded width and scored positions. Under train.packing a micro-batch is the rows
data/packing.py's `collate_packed` builds of its pairs (first-fit decreasing into the row budget), so the
forecast prices the packed rows and their dense [R, 1, L, L] mask, not the padded ones; with a shared
prompt the rank's step is first regrouped as the run regroups it (`step_micro_batches`).

A sample stands for the data set: the sampler's windows and batches keep their size in pairs, so the
spread of lengths within a batch is the data set's, as long as the sample holds a window or more.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# At most this many training pairs are tokenized for a forecast (more where one global batch needs more).
SAMPLE_PAIRS = 256
SAMPLE_SEED = 0  # the sample is the same for every forecast of the same data (cached pass timings match)


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch on one rank, as data/collate.py pads it or data/packing.py packs it."""

    rows: int  # chosen and rejected rows, or one prefix-shared row per pair; packed: the rows built
    width: int  # every row padded to the longest
    response_tokens: int  # the response tokens scored (a chunked LM head runs on these only)
    pairs: tuple[tuple[int, int, int], ...]  # (prompt, chosen, rejected) tokens of each pair
    tokens: int = 0  # the positions holding a token (the batch's num_row_tokens); the rest are padding
    row_tokens: int | None = None  # packed (train.packing): the rows' budget; None: padded

    @property
    def positions(self) -> int:
        return self.rows * self.width

    @property
    def padding(self) -> int:
        return self.positions - self.tokens


@dataclass(frozen=True)
class DataLengths:
    """The pairs a forecast read and the steps it built from them."""

    pairs: list[tuple[int, int, int]]  # (prompt, chosen, rejected) tokens of each sampled pair
    of_pairs: int  # how many training pairs the data set has
    # steps[s][j][r]: micro-batch j of rank r in simulated step s
    steps: list[list[list[MicroBatch]]]

    def describe(self) -> str:
        return f"{len(self.pairs)} of {self.of_pairs} training pairs"

    def micro_batches(self) -> list[MicroBatch]:
        return [mb for step in self.steps for ranks in step for mb in ranks]

    def padding_fraction(self) -> float:
        """The share of the positions the micro-batches compute that are padding (the run's
        perf/padding_fraction, as the trainer counts it)."""
        batches = self.micro_batches()
        computed = sum(mb.positions for mb in batches)
        return sum(mb.padding for mb in batches) / computed if computed else 0.0


# The sampled lengths of the last data settings read in this process: a sweep's points mostly share them.
_last: tuple[str, tuple[list[tuple[int, int, int]], int]] | None = None


def sampled_pair_lengths(cfg, base_dir: Path | None = None) -> tuple[list[tuple[int, int, int]], int]:
    """(prompt, chosen, rejected) tokens of a seeded sample of the config's training pairs, tokenized as the
    run tokenizes them (dpo_sweeps/tokenized.py, the chain the run's train/setup.py reads its pairs with:
    the same readers, tokenizer, chat template, truncation and drops), and how many training pairs there are. Raises what those raise (DataError,
    InvalidConfig, OSError)."""
    global _last
    import json
    from dataclasses import asdict

    key = json.dumps([asdict(cfg.data), asdict(cfg.model), cfg.train.batch_size, str(base_dir or Path.cwd())],
                     sort_keys=True, default=str)
    if _last is None or _last[0] != key:
        _last = (key, _read_sample(cfg, base_dir))
    return _last[1]


def _read_sample(cfg, base_dir: Path | None) -> tuple[list[tuple[int, int, int]], int]:
    from dpo_sweeps.data.row_checks import DroppedRows
    from dpo_sweeps.data.sources import load_preference_rows
    from dpo_sweeps.tokenized import pair_tokenizer

    rows = load_preference_rows(cfg.data, base_dir or Path.cwd())
    tokenizing = pair_tokenizer(cfg, rows)
    size = max(SAMPLE_PAIRS, 2 * cfg.train.batch_size)
    picked = sorted(np.random.default_rng(SAMPLE_SEED).permutation(len(rows.train))[:size].tolist())
    pairs, _ = tokenizing.encode([rows.train[i] for i in picked], [rows.train_where[i] for i in picked],
                                 DroppedRows())
    return [(len(p.prompt), len(p.chosen), len(p.rejected)) for p in pairs], len(rows.train)


def micro_batch_of(pairs: list[tuple[int, int, int]], share_prompt: bool,
                   row_tokens: int | None = None) -> MicroBatch:
    """The rows data/collate.py builds of these pairs: chosen and rejected rows padded to the longest prompt +
    response, or (share_prompt) one row per pair, prompt + chosen + rejected, padded to the longest. With
    `row_tokens` (train.packing): the rows data/packing.py's collate_packed builds under that budget."""
    responses = sum(c + r for _, c, r in pairs)
    if row_tokens is not None:
        return _packed(pairs, share_prompt, row_tokens)
    if share_prompt:
        return MicroBatch(len(pairs), max(p + c + r for p, c, r in pairs), responses, tuple(pairs),
                          tokens=sum(p + c + r for p, c, r in pairs))
    return MicroBatch(2 * len(pairs), max(p + max(c, r) for p, c, r in pairs), responses, tuple(pairs),
                      tokens=sum(2 * p + c + r for p, c, r in pairs))


def _encoded(pairs: list[tuple[int, int, int]]) -> list:
    """Pairs of these token counts (the tokens themselves do not decide the rows)."""
    from dpo_sweeps.data.encoding import EncodedPair

    return [EncodedPair([0] * p, [0] * c, [0] * r) for p, c, r in pairs]


def _packed(pairs: list[tuple[int, int, int]], share_prompt: bool, row_tokens: int) -> MicroBatch:
    """collate_packed's rows of these pairs: its segments (data/packing.py `segments_of`), placed by its
    `first_fit_decreasing`; the width is the fullest row's, as collate_packed pads every row to it."""
    from dpo_sweeps.data.packing import first_fit_decreasing, segments_of

    lengths = [s.length for s in segments_of(_encoded(pairs), share_prompt=share_prompt)]
    rows = first_fit_decreasing(lengths, row_tokens)
    width = max(sum(lengths[k] for k in row) for row in rows)
    return MicroBatch(len(rows), width, sum(c + r for _, c, r in pairs), tuple(pairs), tokens=sum(lengths),
                      row_tokens=row_tokens)


def packed_row_tokens(pairs: list[tuple[int, int, int]], cfg) -> int | None:
    """The budget a packed run's rows get for these pairs (data/packing.py `row_budget`); None: the run
    does not pack (train.packing=false)."""
    if not cfg.train.packing:
        return None
    from dpo_sweeps.data.packing import row_budget, widest_segment

    return row_budget(cfg, widest_segment(_encoded(pairs), share_prompt=cfg.train.share_prompt))


def longest_micro_batch(cfg) -> MicroBatch:
    """The worst case's micro-batch: every pair as long as truncation leaves a long one (data/rows.py's
    `longest_rows`), padded, or packed as the run's budget allows (as the memory estimate counts packed rows)."""
    data = cfg.data
    response = data.max_length - data.max_prompt_length
    pairs = [(data.max_prompt_length, response, response)] * cfg.train.micro_batch_size
    return _micro_batch(pairs, cfg)


def simulated_steps(pairs: list[tuple[int, int, int]], cfg, world_size: int,
                    max_steps: int | None = None) -> list[list[list[MicroBatch]]]:
    """The steps the run's sampler makes of these pairs (one pass over them, at least one step), each cut
    into the ranks' micro-batches."""
    from dpo_sweeps.data.encoding import GlobalBatchSampler, rank_micro_batch_indices

    share = cfg.train.share_prompt
    batch = cfg.train.batch_size
    if len(pairs) < batch:  # a sample smaller than one batch (a small data set): it repeats, as epochs do
        pairs = [pairs[i % len(pairs)] for i in range(batch)]
    lengths = [p + c + r if share else p + max(c, r) for p, c, r in pairs]
    window = cfg.data.length_group_window if cfg.data.length_grouped else 0
    sampler = GlobalBatchSampler(len(pairs), batch, cfg.train.seed, lengths=lengths, group_window=window)
    count = max(1, len(pairs) // batch)
    steps = []
    for step in range(min(count, max_steps or count)):
        indices = sampler.indices(step)
        per_rank = [rank_micro_batch_indices(indices, r, world_size, cfg.train.micro_batch_size)
                    for r in range(world_size)]
        ranks = [_rank_step([[pairs[i] for i in micro] for micro in per_rank[r]], cfg) for r in range(world_size)]
        steps.append([[ranks[r][j] for r in range(world_size)] for j in range(len(per_rank[0]))])
    return steps


def _rank_step(micro_batches: list[list[tuple[int, int, int]]], cfg) -> list[MicroBatch]:
    """One rank's micro-batches of a step as the run trains them (train/scoring.py
    `training_micro_batches`): packed with a shared prompt, regrouped across the step (data/packing.py
    `packed_step`), each group then packed by collate_packed."""
    if cfg.train.packing and cfg.train.share_prompt:
        from dpo_sweeps.data.packing import packed_step

        micro_batches = packed_step(micro_batches, sum, cfg)
    return [_micro_batch(micro, cfg) for micro in micro_batches]


def _micro_batch(pairs: list[tuple[int, int, int]], cfg) -> MicroBatch:
    """The micro-batch the run's collator (train/scoring.py `collate_pairs`) builds of these pairs."""
    return micro_batch_of(pairs, cfg.train.share_prompt, packed_row_tokens(pairs, cfg))


def data_lengths(cfg, world_size: int, base_dir: Path | None = None) -> DataLengths:
    """The sampled pairs of a config and the steps its run would make of them."""
    pairs, total = sampled_pair_lengths(cfg, base_dir)
    if not pairs:
        from dpo_sweeps.errors import DataError

        raise DataError("data: no training pair left to size a step with")
    return DataLengths(pairs, total, simulated_steps(pairs, cfg, world_size))
