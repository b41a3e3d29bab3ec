"""Packed micro-batches (train.packing, data/packing.py) hold the same pairs as padded ones, and score them
alike: the traps packed DPO has hit elsewhere, each pinned down, and the log-probs and gradients of a tiny
model packed against padded."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps import api
from dpo_sweeps.checks.validate import validate_config
from dpo_sweeps.config.schema import Config, ModelConfig
from dpo_sweeps.data.collate import collate
from dpo_sweeps.data.encoding import EncodedPair
from dpo_sweeps.data.packing import collate_packed, first_fit_decreasing, step_micro_batches
from dpo_sweeps.dpo.response_logps import attention_path, response_logps
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.models.build import build_policy
from dpo_sweeps.models.tokenizers import byte_tokenizer

PAD = 0


def ragged_pairs(n: int, seed: int = 0, vocab: int = 250) -> list[EncodedPair]:
    """Pairs of very different lengths, as real preference data has them (tokens 1..vocab: never the pad id)."""
    rng = random.Random(seed)

    def tokens(lo: int, hi: int) -> list[int]:
        return [rng.randint(1, vocab) for _ in range(rng.randint(lo, hi))]

    return [EncodedPair(tokens(1, 20), tokens(1, 24), tokens(1, 24)) for _ in range(n)]


def spans(segment_ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """(segment id, start, end) of each run of equal ids in a row, padding (-1) left out."""
    out, start = [], 0
    ids = segment_ids.tolist()
    for t in range(1, len(ids) + 1):
        if t == len(ids) or ids[t] != ids[start]:
            if ids[start] != -1:
                out.append((ids[start], start, t))
            start = t
    return out


def expected_layout(pair: EncodedPair, sequence: int, b: int, share_prompt: bool):
    """A segment's tokens, positions and mask as collate.py lays out one pair (or one of its responses)."""
    p, c, r = len(pair.prompt), len(pair.chosen), len(pair.rejected)
    if share_prompt:
        tokens = pair.prompt + pair.chosen + pair.rejected
        positions = list(range(p + c)) + list(range(p, p + r))
        mask = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()
        mask[p + c :, p : p + c] = False
        return tokens, positions, mask
    tokens = pair.prompt + (pair.chosen if sequence < b else pair.rejected)
    return tokens, list(range(len(tokens))), torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()


LAYOUTS = pytest.mark.parametrize("share_prompt", [True, False], ids=["shared_prompt", "unshared"])


@LAYOUTS
@pytest.mark.parametrize("budget", [80, 120, 300])
def test_every_pair_is_placed_once_whole_within_the_budget_with_positions_restarting(share_prompt, budget):
    pairs = ragged_pairs(12)
    batch = collate_packed(pairs, PAD, row_tokens=budget, share_prompt=share_prompt)
    b = len(pairs)
    assert batch["input_ids"].shape[1] <= budget
    assert batch["input_ids"].shape[0] < (b if share_prompt else 2 * b)  # several segments share a row
    seen = []
    for row in range(batch["input_ids"].shape[0]):
        for seq, start, end in spans(batch["segment_ids"][row]):
            seen.append(seq)
            tokens, positions, _ = expected_layout(pairs[seq % b], seq, b, share_prompt)
            assert batch["input_ids"][row, start:end].tolist() == tokens
            assert batch["position_ids"][row, start:end].tolist() == positions  # restart at every segment
    assert sorted(seen) == list(range(b if share_prompt else 2 * b))  # each exactly once, never split
    padded = collate(pairs, PAD, share_prompt=share_prompt)
    assert int(batch["num_tokens"]) == int(padded["num_tokens"])  # tokens/s counts the same tokens
    assert int(batch["num_row_tokens"]) == int((batch["segment_ids"] >= 0).sum())
    assert int(batch["num_pairs"]) == b
    # Deterministic: the same pairs give the same rows.
    again = collate_packed(pairs, PAD, row_tokens=budget, share_prompt=share_prompt)
    assert all(torch.equal(batch[k], again[k]) for k in batch)


@LAYOUTS
def test_no_token_attends_to_another_segment_and_rejected_never_sees_chosen(share_prompt):
    pairs = ragged_pairs(10, seed=1)
    batch = collate_packed(pairs, PAD, row_tokens=100, share_prompt=share_prompt)
    b = len(pairs)
    for row in range(batch["input_ids"].shape[0]):
        mask = batch["attention_mask"][row, 0]
        expected = torch.zeros_like(mask)
        end = 0
        for seq, start, end in spans(batch["segment_ids"][row]):
            expected[start:end, start:end] = expected_layout(pairs[seq % b], seq, b, share_prompt)[2]
        expected[end:, 0] = True  # padding queries: position 0 only, so no query row is empty
        assert torch.equal(mask, expected)


@LAYOUTS
def test_padding_sits_only_at_row_ends_and_no_real_token_attends_to_it(share_prompt):
    pairs = ragged_pairs(10, seed=2)
    batch = collate_packed(pairs, PAD, row_tokens=90, share_prompt=share_prompt)
    assert (batch["segment_ids"] == -1).any()
    for row in range(batch["input_ids"].shape[0]):
        ids = batch["segment_ids"][row]
        real = int((ids >= 0).sum())
        assert (ids[:real] >= 0).all() and (ids[real:] == -1).all()  # never between two segments
        assert (batch["input_ids"][row, real:] == PAD).all()
        assert not batch["attention_mask"][row, 0, :real, real:].any()


@LAYOUTS
def test_every_target_is_predicted_inside_its_own_segment(share_prompt):
    pairs = ragged_pairs(10, seed=3)
    batch = collate_packed(pairs, PAD, row_tokens=100, share_prompt=share_prompt)
    b = len(pairs)
    rows, positions = batch["token_rows"], batch["token_positions"]
    sequences, targets = batch["token_sequences"], batch["token_targets"]
    segment_of_token = batch["segment_ids"][rows, positions]
    # The predicting position lies in the pair's (shared) or the sequence's own segment.
    assert torch.equal(segment_of_token, sequences % b if share_prompt else sequences)
    for seq in range(2 * b):
        pair = pairs[seq % b]
        assert targets[sequences == seq].tolist() == (pair.chosen if seq < b else pair.rejected)
    # A predicting position never reaches the next segment: the token after it is in the same segment,
    # or (the last response token is never a predictor) the position is not a segment's last.
    for r, t in zip(rows.tolist(), positions.tolist()):
        assert t + 1 < batch["segment_ids"].shape[1] and batch["segment_ids"][r, t + 1] == batch["segment_ids"][r, t]


@LAYOUTS
def test_a_row_with_one_pair_equals_the_padded_row(share_prompt):
    pairs = ragged_pairs(6, seed=4)
    widest = max(range(len(pairs)), key=lambda i: len(pairs[i].prompt) + len(pairs[i].chosen) + len(pairs[i].rejected))
    pair = pairs[widest]
    alone = collate(pairs[widest : widest + 1], PAD, share_prompt=share_prompt)
    # A budget of exactly the pair's widest row: nothing else fits beside it.
    budget = alone["input_ids"].shape[1]
    batch = collate_packed(pairs, PAD, row_tokens=budget, share_prompt=share_prompt)
    b = len(pairs)
    for seq in ([widest] if share_prompt else [widest, b + widest]):
        row = next(r for r in range(batch["input_ids"].shape[0]) if spans(batch["segment_ids"][r])[0][0] == seq)
        ((_, start, n),) = spans(batch["segment_ids"][row])
        assert start == 0
        if share_prompt:
            padded_ids, padded_pos = alone["input_ids"][0, :n], alone["position_ids"][0, :n]
            padded_mask = alone["attention_mask"][0, 0, :n, :n]
        else:
            k = 0 if seq < b else 1
            padded_ids, padded_pos = alone["input_ids"][k, :n], torch.arange(n)
            assert int(alone["attention_mask"][k].sum()) == n
            padded_mask = torch.ones(n, n, dtype=torch.bool).tril()
        assert torch.equal(batch["input_ids"][row, :n], padded_ids)
        assert torch.equal(batch["position_ids"][row, :n], padded_pos)
        assert torch.equal(batch["attention_mask"][row, 0, :n, :n], padded_mask)
    assert len(pair.prompt) > 0


def test_first_fit_decreasing_fills_rows_longest_first():
    assert first_fit_decreasing([5, 9, 3, 7, 2], 10) == [[1], [3, 2], [0, 4]]
    assert first_fit_decreasing([4, 4, 4], 4) == [[0], [1], [2]]


def test_a_pair_wider_than_the_budget_is_refused_naming_the_setting():
    pairs = [EncodedPair([1, 2, 3], [4, 5], [6, 7, 8])]
    with pytest.raises(InvalidConfig, match=r"train.micro_batch_tokens: 7 is narrower .* takes 8 tokens .*"
                                            r"accepted: an integer >= 8"):
        collate_packed(pairs, PAD, row_tokens=7, share_prompt=True)
    collate_packed(pairs, PAD, row_tokens=8, share_prompt=True)
    collate_packed(pairs, PAD, row_tokens=6, share_prompt=False)  # unshared: rows of prompt + one response


def config(*overrides: str) -> Config:
    values = OmegaConf.to_container(api.compose(overrides), resolve=False)
    values.pop("hydra", None)
    return Config.of(OmegaConf.to_container(OmegaConf.create(values), resolve=True))


@pytest.mark.parametrize(("share_prompt", "widest"), [(True, 160), (False, 96)])
def test_a_budget_below_the_widest_row_a_pair_can_take_is_refused_before_launch(share_prompt, widest):
    limits = ["data.max_length=96", "data.max_prompt_length=32", f"train.share_prompt={share_prompt}",
              "train.packing=true"]
    with pytest.raises(InvalidConfig, match=rf"^train.micro_batch_tokens: {widest - 1} with train.packing=true .*"
                                            rf"\({widest} tokens.*accepted: an integer >= {widest}, or null\)"):
        validate_config(config(*limits, f"train.micro_batch_tokens={widest - 1}"), Path("."))
    validate_config(config(*limits, f"train.micro_batch_tokens={widest}"), Path("."))
    validate_config(config(*limits), Path("."))  # null: the widest row


def tiny_model(preset: str, tokenizer, attention: str | None = None):
    model_cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(REPO / "conf" / "model" / f"{preset}.yaml"))
    model = build_policy(model_cfg, tokenizer, seed=0)
    if attention is not None:
        model.config._attn_implementation = attention
    return model


def scored(model, batch) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Per-sequence log-probs, token counts, and the gradients of a DPO-like weighted sum of them."""
    model.zero_grad()
    found = response_logps(model, batch, chunk_size=16)
    weights = torch.linspace(-1.0, 1.0, found.sums.numel())
    (found.sums * weights).sum().backward()
    return found.sums.detach(), found.counts, [p.grad.clone() for p in model.parameters()]


@LAYOUTS
@pytest.mark.parametrize(("preset", "attention"), [("tiny_gpt2", None), ("tiny_llama", None),
                                                   ("tiny_llama", "eager")])
def test_packed_log_probs_and_gradients_equal_the_padded_ones(preset, attention, share_prompt):
    tokenizer = byte_tokenizer()
    model = tiny_model(preset, tokenizer, attention)
    assert attention_path(model, dense_mask=True) == f"{attention or 'sdpa'}_dense_mask"  # eager: the additive mask
    pairs = ragged_pairs(8, seed=5, vocab=200)
    padded = collate(pairs, tokenizer.pad_token_id, share_prompt=share_prompt)
    packed = collate_packed(pairs, tokenizer.pad_token_id, row_tokens=128, share_prompt=share_prompt)
    assert packed["input_ids"].shape[0] < padded["input_ids"].shape[0]
    logps, counts, grads = scored(model, padded)
    packed_logps, packed_counts, packed_grads = scored(model, packed)
    assert torch.equal(packed_counts, counts)
    torch.testing.assert_close(packed_logps, logps, rtol=1e-5, atol=1e-5)
    for g_packed, g in zip(packed_grads, grads, strict=True):
        torch.testing.assert_close(g_packed, g, rtol=1e-5, atol=1e-5)


def test_the_memory_estimate_counts_packed_rows_as_fewer_rows_as_wide_as_the_budget():
    from dpo_sweeps.parallel.memory_estimate import ModelShape, RunShape, activations, logits

    model = ModelShape(num_params=134_515_008, num_layers=30, hidden=576, intermediate=1536, vocab=49152)
    padded = RunShape(shard_group_size=1, param_dtype="float32", optimizer="adamw", micro_batch_size=8, seq_len=100,
                      logps_chunk_size=1024, share_prompt=True)
    one_a_row = RunShape(**{**padded.__dict__, "packing": True, "row_tokens": None})
    two_a_row = RunShape(**{**padded.__dict__, "packing": True, "row_tokens": 250})  # 2 pairs of 100 fit, not 3
    assert activations(model, one_a_row) == activations(model, padded)
    # 4 rows (2 pairs of 100 a row), each as wide as the budget, since ragged pairs can fill a row to it:
    # what 4 prefix-shared rows 250 long hold, mask included.
    four_rows = RunShape(**{**padded.__dict__, "micro_batch_size": 4, "seq_len": 250})
    assert logits(model, two_a_row) == logits(model, four_rows)
    assert activations(model, two_a_row) == activations(model, four_rows)


@pytest.mark.parametrize("seed", range(20))
def test_a_packed_micro_batch_stays_within_the_rows_and_width_the_memory_estimate_counts(seed):
    """Pairs of any lengths up to the longest (100) in a step of 2 micro-batches of 8, budget 250: each
    micro-batch collate_packed builds is at most ceil(8 / 2) rows of at most 250 positions."""
    rng = random.Random(seed)
    pairs = [EncodedPair([1] * rng.randint(1, 40), [2] * rng.randint(1, 30), [3] * rng.randint(1, 30))
             for _ in range(16)]
    lengths = [len(p.prompt) + len(p.chosen) + len(p.rejected) for p in pairs]
    for group in step_micro_batches(lengths, 250, 2):
        rows, width = collate_packed([pairs[k] for k in group], PAD, row_tokens=250, share_prompt=True)["input_ids"].shape
        assert rows <= 4 and width <= 250


# A rank's step of 8 pairs at HH-like ragged lengths (prefix-shared rows), 2 micro-batches of 4.
STEP = [300, 40, 520, 75, 130, 610, 90, 260]


def _positions(lengths: list[int], groups: list[list[int]], budget: int) -> int:
    """What collate_packed computes for these micro-batches: rows x the fullest row's width, each packed
    by its own first-fit decreasing."""
    total = 0
    for group in groups:
        rows = first_fit_decreasing([lengths[k] for k in group], budget)
        total += len(rows) * max(sum(lengths[group[k]] for k in row) for row in rows)
    return total


@pytest.mark.parametrize(("lengths", "budget", "count"),
                         [(STEP, 768, 2), (STEP, 768, 4), (STEP, 610, 8), ([10] * 8, 768, 4), ([5, 700], 768, 2)]
                         + [([random.Random(s).randint(1, 700) for _ in range(32)], 768, 8) for s in range(3)])
def test_a_step_is_packed_into_count_micro_batches_of_whole_rows(lengths, budget, count):
    groups = step_micro_batches(lengths, budget, count)
    assert len(groups) == count and all(groups)  # every rank runs as many forwards as the padded step
    assert sorted(k for g in groups for k in g) == list(range(len(lengths)))  # every pair exactly once
    for group in groups:
        assert group == sorted(group)  # in the step's order
        assert all(sum(lengths[group[k]] for k in row) <= budget
                   for row in first_fit_decreasing([lengths[k] for k in group], budget))
    assert step_micro_batches(list(lengths), budget, count) == groups  # a pure function of the lengths


def test_packing_the_step_computes_fewer_positions_than_packing_each_micro_batch():
    per_micro_batch = [[0, 1, 2, 3], [4, 5, 6, 7]]  # the sampler's micro-batches of 4 pairs: 2 rows each
    # The step's rows: 740 (610 + 130), 725 (520 + 90 + 75 + 40), 560 (300 + 260); the two near-full ones
    # travel together, and the partial one does not widen them.
    step = step_micro_batches(STEP, 768, 2)
    assert step == [[1, 2, 3, 4, 5, 6], [0, 7]]
    assert _positions(STEP, step, 768) == 2 * 740 + 560
    assert _positions(STEP, per_micro_batch, 768) == 2 * 635 + 2 * 740


def test_a_step_with_fewer_rows_than_micro_batches_splits_its_fullest_rows():
    groups = step_micro_batches([10] * 8, 768, 4)  # one row would hold all 8
    assert sorted(len(g) for g in groups) == [2, 2, 2, 2]
    with pytest.raises(ValueError):
        step_micro_batches([10] * 3, 768, 4)  # a micro-batch would be empty
