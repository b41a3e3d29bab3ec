"""Packed micro-batches (`train.packing`): the same pairs as a padded step, placed into rows of at most
`train.micro_batch_tokens` tokens, so that the step computes little padding. With a shared prompt the
rank's whole step is packed and its rows dealt into micro-batches (`step_micro_batches`); with prompts
apart each micro-batch of pairs is packed on its own (`collate_packed`).

Each pair is laid out as data/collate.py lays it out unpacked: with `train.share_prompt` one segment,
prompt + chosen + rejected, the rejected tokens attending to the prompt and to themselves; without, two
segments, prompt + chosen and prompt + rejected, each a sequence of its own (placed independently, as a
padded micro-batch places them in rows of their own). Inside a row every segment restarts its
position_ids at 0 and attends only to its own tokens, through a dense 4-D boolean mask [R, 1, L, L]
(SDPA on any device; the additive form for eager attention, dpo/response_logps.py); padding at a row's
end attends to the row's position 0 only, as in collate.py, so that no query row is empty. Response
tokens are scored where the segment predicts them (`token_rows`/`token_positions`), in the very order
collate.py lists them, so a step's per-sequence log-probs, loss and gradient are the padded step's up
to float rounding.

The traps packed DPO has hit elsewhere (../shared/notes/dpo-anchors.md) and what prevents each here:
positions that do not restart (position_ids per segment), a rejected response that sees the chosen one
or another pair's tokens (the mask is built per segment; padding rows open only column 0), padding
folded into a neighbour's span (padding only at a row's end, never between segments), and an all-ones
mask read as "no packing" (the mask is always the explicit 4-D one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from dpo_sweeps.data.collate import with_reference_logps
from dpo_sweeps.data.encoding import EncodedPair
from dpo_sweeps.data.rows import longest_rows_of
from dpo_sweeps.errors import InvalidConfig

T = TypeVar("T")


@dataclass(frozen=True)
class Segment:
    """One attention span of a packed row: a whole prefix-shared pair, or one response with its prompt."""

    pair: int  # the pair's place in the micro-batch
    sequence: int  # the sequence it scores: chosen i -> i, rejected i -> B + i (shared: the pair's chosen, i)
    tokens: list[int]
    prompt: int  # prompt tokens at its start
    chosen: int | None  # a shared pair: its chosen tokens after the prompt (the rest are the rejected ones)

    @property
    def length(self) -> int:
        return len(self.tokens)


def segments_of(pairs: list[EncodedPair], *, share_prompt: bool) -> list[Segment]:
    """The micro-batch's segments: one per pair when the prompt is shared, else the chosen ones then the
    rejected ones (collate.py's row order)."""
    if share_prompt:
        return [Segment(i, i, p.prompt + p.chosen + p.rejected, len(p.prompt), len(p.chosen))
                for i, p in enumerate(pairs)]
    b = len(pairs)
    return ([Segment(i, i, p.prompt + p.chosen, len(p.prompt), None) for i, p in enumerate(pairs)]
            + [Segment(i, b + i, p.prompt + p.rejected, len(p.prompt), None) for i, p in enumerate(pairs)])


def widest_segment(pairs: list[EncodedPair], *, share_prompt: bool) -> int:
    """The longest segment of these pairs: the narrowest row budget that takes every one of them."""
    if share_prompt:
        return max((len(p.prompt) + len(p.chosen) + len(p.rejected) for p in pairs), default=0)
    return max((len(p.prompt) + max(len(p.chosen), len(p.rejected)) for p in pairs), default=0)


def check_pairs_fit(pairs: list[EncodedPair], micro_batch_tokens: int, *, share_prompt: bool) -> None:
    """Refuse a set row budget that some pair cannot fit into (before the first step: train/setup.py)."""
    widest = widest_segment(pairs, share_prompt=share_prompt)
    if widest > micro_batch_tokens:
        what = "prompt + chosen + rejected" if share_prompt else "prompt + response"
        raise InvalidConfig("train.micro_batch_tokens", f"{micro_batch_tokens} is narrower than a pair of the data, "
                            f"whose {what} takes {widest} tokens (pairs are never split across rows)",
                            f"an integer >= {widest}, or null (the widest row a pair can take)")


def row_budget(cfg, widest: int) -> int:
    """The packed rows' budget for pairs whose widest segment is `widest` (widest_segment): a set
    train.micro_batch_tokens, or (null) the widest row one pair takes at the data limits (data/rows.py);
    either widened to `widest` where that is wider (a prefix-shared pair with a short prompt and two long
    responses), so no row is narrower than a padded micro-batch of the same pairs would be. A run never
    widens a set budget: setup refuses one narrower than a pair of the data (check_pairs_fit) before its
    first step; the forecast, priced before that check, widens it rather than fail."""
    budget = cfg.train.micro_batch_tokens
    return max(budget if budget is not None else longest_rows_of(cfg).length, widest)


def packed_step(micro_batches: list[list[T]], length: Callable[[T], int], cfg) -> list[list[T]]:
    """A rank's step as a packed run with a shared prompt trains it: the step's items (pairs, or the
    forecast's token counts of them; `length`: an item's prefix-shared row) regrouped by step_micro_batches
    under the budget of the whole step, into as many micro-batches as the padded step runs."""
    items = [x for micro in micro_batches for x in micro]
    lengths = [length(x) for x in items]
    groups = step_micro_batches(lengths, row_budget(cfg, max(lengths)), len(micro_batches))
    return [[items[k] for k in group] for group in groups]


def first_fit_decreasing(lengths: list[int], budget: int) -> list[list[int]]:
    """Bins of at most `budget` for items of `lengths` (each <= budget): longest first, each into the
    first row with room, ties by index, so the rows are a pure function of the lengths."""
    rows: list[list[int]] = []
    room: list[int] = []
    for k in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for j, free in enumerate(room):
            if lengths[k] <= free:
                rows[j].append(k)
                room[j] -= lengths[k]
                break
        else:
            rows.append([k])
            room.append(budget - lengths[k])
    return rows


def step_micro_batches(lengths: list[int], budget: int, count: int) -> list[list[int]]:
    """One rank's step of pairs (their prefix-shared rows' `lengths`, each <= budget) as `count`
    micro-batches of pair indices, packed across the whole step rather than micro-batch by micro-batch.

    The pairs go into rows of at most `budget` by first-fit decreasing; while there are fewer rows than
    `count`, the row holding the most pairs is split in two (count <= pairs, so one always holds two).
    The rows, fullest first, are dealt into `count` contiguous runs of as equal a number of rows as
    possible, so the near-full rows travel together and a partial row does not widen the full ones.

    `count` is the number of micro-batches the padded step would run: every rank keeps it whatever its
    pairs' lengths, since FSDP's collectives need each rank to run the same number of forwards and
    backwards. Each micro-batch lists its pairs in the step's order (collate_packed packs them again,
    its own first-fit decreasing under the same budget)."""
    if not 1 <= count <= len(lengths):
        raise ValueError(f"{count} micro-batches of {len(lengths)} pairs")
    rows = first_fit_decreasing(lengths, budget)
    while len(rows) < count:  # no micro-batch may be empty
        j = max(range(len(rows)), key=lambda j: (len(rows[j]), -j))
        row = rows[j]
        half = (len(row) + 1) // 2
        rows[j : j + 1] = [row[:half], row[half:]]
    rows.sort(key=lambda row: -sum(lengths[k] for k in row))  # stable: ties keep first-fit order
    size, extra = divmod(len(rows), count)
    micro_batches, start = [], 0
    for m in range(count):  # the fullest runs take the extra rows: a run's width is its first row's fill
        end = start + size + (1 if m < extra else 0)
        micro_batches.append(sorted(k for row in rows[start:end] for k in row))
        start = end
    return micro_batches


def collate_packed(pairs: list[EncodedPair], pad_id: int, *, row_tokens: int,
                   share_prompt: bool) -> dict[str, torch.Tensor]:
    """One micro-batch of pairs as packed rows of at most `row_tokens` tokens (see the module docstring).

    The keys are collate.py's (`position_ids` and a 4-D `attention_mask` as with share_prompt), plus
    `segment_ids` [R, L]: the segment's sequence at each position (-1 for padding).
    """
    segments = segments_of(pairs, share_prompt=share_prompt)
    lengths = [s.length for s in segments]
    if max(lengths) > row_tokens:
        check_pairs_fit(pairs, row_tokens, share_prompt=share_prompt)
    rows = first_fit_decreasing(lengths, row_tokens)
    width = max(sum(lengths[k] for k in row) for row in rows)
    n_rows = len(rows)
    input_ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((n_rows, width), dtype=torch.long)
    segment_ids = torch.full((n_rows, width), -1, dtype=torch.long)
    mask = torch.zeros((n_rows, 1, width, width), dtype=torch.bool)
    placed: dict[int, tuple[int, int]] = {}  # segment -> (row, offset)
    for r, row in enumerate(rows):
        offset = 0
        for k in row:
            seg = segments[k]
            end = offset + seg.length
            input_ids[r, offset:end] = torch.tensor(seg.tokens)
            position_ids[r, offset:end] = _positions(seg)
            segment_ids[r, offset:end] = seg.sequence
            mask[r, 0, offset:end, offset:end] = _segment_mask(seg)
            placed[k] = (r, offset)
            offset = end
        mask[r, 0, offset:, 0] = True  # padding queries: the row's first position only, as in collate.py

    token_rows, token_positions, targets, sequences = [], [], [], []
    for k, seg in enumerate(segments):  # collate.py's order: pair by pair (shared), else chosen then rejected
        r, offset = placed[k]
        positions, seg_targets, seg_sequences = _scored(seg, len(pairs))
        token_rows += [r] * len(positions)
        token_positions += [offset + t for t in positions]
        targets += seg_targets
        sequences += seg_sequences
    batch = {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids,
             "segment_ids": segment_ids, "token_rows": torch.tensor(token_rows),
             "token_positions": torch.tensor(token_positions), "token_targets": torch.tensor(targets),
             "token_sequences": torch.tensor(sequences),
             "num_tokens": torch.tensor(sum(2 * len(p.prompt) + len(p.chosen) + len(p.rejected) for p in pairs)),
             "num_row_tokens": torch.tensor(sum(lengths)), "num_pairs": torch.tensor(len(pairs))}
    return with_reference_logps(batch, pairs)


def _positions(seg: Segment) -> torch.Tensor:
    """Positions restart at the segment's start; a shared pair's rejected tokens follow the prompt."""
    if seg.chosen is None:
        return torch.arange(seg.length)
    p, c = seg.prompt, seg.chosen
    return torch.cat([torch.arange(p + c), torch.arange(p, seg.length - c)])


def _segment_mask(seg: Segment) -> torch.Tensor:
    causal = torch.ones((seg.length, seg.length), dtype=torch.bool).tril_()
    if seg.chosen is not None:  # the rejected tokens never see the chosen ones
        p, c = seg.prompt, seg.chosen
        causal[p + c :, p : p + c] = False
    return causal


def _scored(seg: Segment, b: int) -> tuple[list[int], list[int], list[int]]:
    """(position predicting each response token, the token, its sequence), offsets in the segment."""
    p, n = seg.prompt, seg.length
    if seg.chosen is None:
        return list(range(p - 1, n - 1)), seg.tokens[p:], [seg.sequence] * (n - p)
    c = seg.chosen
    # As collate_shared_prompt: rejected token 0 is predicted by the prompt's last token.
    positions = list(range(p - 1, p + c - 1)) + [p - 1] + list(range(p + c, n - 1))
    return positions, seg.tokens[p:], [seg.pair] * c + [b + seg.pair] * (n - p - c)
