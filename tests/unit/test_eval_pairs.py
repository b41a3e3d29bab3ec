"""Held-out passes (data/encoding.py eval_micro_batch_indices, memory_estimate.py eval_batching) and the
per-pair records rank 0 writes from them (rundir/eval_pairs.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from dpo_sweeps.data.encoding import EVAL_PASS_PADDING, EVAL_SHORT_ROW, EvalBatching, eval_micro_batch_indices
from dpo_sweeps.parallel.memory_estimate import (
    ModelShape,
    RunShape,
    estimate_peak_memory,
    eval_batching,
    eval_pass,
    training_pass,
)
from dpo_sweeps.rundir.eval_pairs import EVAL_PAIRS, GATHERED, SCHEMA, EvalPairsLog, pair_ids

SMOLLM2 = ModelShape(num_params=134_515_008, num_layers=30, hidden=576, intermediate=1536, vocab=49_152)
RUN = RunShape(shard_group_size=2, param_dtype="bfloat16", optimizer="adamw", micro_batch_size=8, seq_len=512,
               precompute_reference_logps=True, logps_chunk_size=1024, share_prompt=True)


@pytest.mark.parametrize("batching", [EvalBatching(max_pairs=4), EvalBatching(max_pairs=None, max_tokens=300),
                                      EvalBatching(max_pairs=3, max_tokens=10_000)])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_held_out_pair_is_scored_once_and_every_rank_makes_the_same_passes(batching, world_size):
    sizes = [(37 * i) % 101 + 5 for i in range(23)]
    per_rank = [eval_micro_batch_indices(sizes, rank, world_size, batching) for rank in range(world_size)]
    assert len({len(passes) for passes in per_rank}) == 1  # FSDP's forwards are collective
    for j in range(len(per_rank[0])):
        assert len({len(passes[j]) for passes in per_rank}) == 1
    scored = [i for passes in per_rank for idx in passes for i in idx]
    assert sorted(i for i in scored if i < len(sizes)) == list(range(len(sizes)))
    padding = [i for i in scored if i >= len(sizes)]
    assert len(padding) == -len(sizes) % world_size  # only the last round is padded
    for passes in per_rank:
        for idx in passes:
            if batching.max_pairs is not None:
                assert len(idx) <= batching.max_pairs
            widest = max(sizes[i % len(sizes)] for i in idx)
            if batching.max_tokens is not None and len(idx) > 1:
                assert len(idx) * widest <= batching.max_tokens


def test_pairs_pass_longest_first_so_short_pairs_share_a_pass():
    sizes = [10, 200, 12, 11, 190, 9]
    passes = eval_micro_batch_indices(sizes, 0, 1, EvalBatching(max_pairs=None, max_tokens=400))
    assert passes == [[1, 4], [2, 3, 0, 5]]


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_budget_of_many_pairs_still_cuts_passes_where_padding_would_grow(world_size):
    # Ragged sizes as HH's are, and a budget that would take them all in one pass padded to the longest.
    rng = np.random.default_rng(0)
    sizes = [int(x) for x in rng.integers(EVAL_SHORT_ROW, 400, size=101)]
    batching = EvalBatching(max_pairs=None, max_tokens=10**9)
    per_rank = [eval_micro_batch_indices(sizes, rank, world_size, batching) for rank in range(world_size)]
    assert 1 < len(per_rank[0]) < len(sizes) // 4
    for j in range(len(per_rank[0])):  # each pass: every rank's pairs padded to the widest of all of them
        idx = [i % len(sizes) for passes in per_rank for i in passes[j]]
        widest = max(sizes[i] for i in idx)
        assert sum(widest - sizes[i] for i in idx) <= EVAL_PASS_PADDING * len(idx) * widest
    padded = sum(len(idx) * max(sizes[i % len(sizes)] for i in idx) for passes in per_rank for idx in passes)
    assert padded <= (1 + EVAL_PASS_PADDING) * sum(sizes) + world_size * 400


def test_the_derived_eval_pass_fits_where_training_peaks_and_holds_more_pairs():
    batching = eval_batching(SMOLLM2, RUN)
    assert batching.max_pairs is None
    assert eval_pass(SMOLLM2, RUN, batching.max_tokens) <= training_pass(SMOLLM2, RUN)
    assert batching.max_tokens >= 8 * RUN.micro_batch_size * RUN.seq_len  # a no-grad pass saves nothing for backward
    assert estimate_peak_memory(SMOLLM2, RUN).eval_excess == 0


def test_a_set_eval_micro_batch_beyond_what_training_holds_raises_the_estimate():
    derived_pairs = eval_batching(SMOLLM2, RUN).max_tokens // RUN.seq_len
    small = dataclasses.replace(RUN, eval_micro_batch_size=RUN.micro_batch_size)
    large = dataclasses.replace(RUN, eval_micro_batch_size=4 * derived_pairs)
    assert eval_batching(SMOLLM2, small) == EvalBatching(max_pairs=RUN.micro_batch_size)
    assert estimate_peak_memory(SMOLLM2, small).total == estimate_peak_memory(SMOLLM2, RUN).total
    excess = estimate_peak_memory(SMOLLM2, large).eval_excess
    assert excess > 0 and estimate_peak_memory(SMOLLM2, large).total == estimate_peak_memory(SMOLLM2, RUN).total + excess


def test_pair_ids_hash_the_token_ids_and_stay_unique_for_a_repeated_pair():
    pairs = [([1, 2], [3], [4]), ([1], [2, 3], [4]), ([1, 2], [3], [4])]
    ids = pair_ids(pairs)
    assert len(set(ids)) == 3 and all(len(i) == 16 for i in ids)
    assert pair_ids(pairs) == ids  # the same in every run of the same pairs
    assert pair_ids(pairs[:2]) == ids[:2]


def _gathered(indices: list[int], correct: list[bool], reference: bool = True) -> np.ndarray:
    rows = []
    for i, ok in zip(indices, correct):
        ref = (-float(i) - 0.5, -float(i) - 1.5) if reference else (math.nan, math.nan)
        rows.append([i, -float(i), -float(i) - 1, *ref, float(ok)])
    assert len(rows[0]) == len(GATHERED)
    return np.array(rows, dtype=np.float64)


def test_rank_zero_writes_one_row_per_pair_by_pair_index_and_replaces_a_repeated_step(tmp_path):
    ids = pair_ids([([i], [i + 1], [i + 2]) for i in range(5)])
    log = EvalPairsLog(tmp_path, ids)
    # Two ranks' passes, in rank order, the last round padded (index 5 stands for pair 0).
    log.write(2, _gathered([4, 2, 0, 3, 1, 5], [True, False, True, True, False, True]))
    log.write(4, _gathered([4, 2, 0, 3, 1, 5], [True, True, True, True, False, True], reference=False))
    table = pq.read_table(tmp_path / EVAL_PAIRS)
    assert table.schema == SCHEMA
    rows = table.to_pylist()
    assert [(r["step"], r["pair_id"]) for r in rows] == [(2, i) for i in ids] + [(4, i) for i in ids]
    assert [r["correct"] for r in rows[:5]] == [True, False, False, True, True]
    assert rows[3]["policy_chosen_logps"] == -3.0 and rows[3]["reference_rejected_logps"] == -4.5
    assert math.isnan(rows[7]["reference_chosen_logps"])  # a loss without a reference

    resumed = EvalPairsLog(tmp_path, ids)  # a resumed attempt from a checkpoint of step 3
    resumed.truncate_after(3)
    assert {r["step"] for r in pq.read_table(tmp_path / EVAL_PAIRS).to_pylist()} == {2}
    resumed.write(4, _gathered([0, 1, 2, 3, 4], [False] * 5))
    resumed.write(4, _gathered([0, 1, 2, 3, 4], [True] * 5))  # the same step again: replaced, not added
    rows = pq.read_table(tmp_path / EVAL_PAIRS).to_pylist()
    assert [r["step"] for r in rows].count(4) == 5 and all(r["correct"] for r in rows if r["step"] == 4)
    assert not list(tmp_path.glob(".*.tmp"))
