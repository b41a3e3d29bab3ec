"""The rows of a micro-batch of long pairs, from the data limits alone (no torch: the fit check and the
cost prediction size a step with it before anything is imported or read)."""

from __future__ import annotations

from typing import NamedTuple


class Rows(NamedTuple):
    """The rows of one micro-batch: how many, their padded length, and the response tokens among them."""

    rows: int
    length: int
    response_tokens: int

    @property
    def response_fraction(self) -> float:
        """The share of the rows' positions that hold response tokens (what a chunked LM head scores)."""
        return self.response_tokens / max(1, self.rows * self.length)


def longest_rows(pairs: int, max_length: int, max_prompt_length: int, *, share_prompt: bool) -> Rows:
    """The rows of a micro-batch of `pairs` long pairs, as data/collate.py lays them out: every pair as
    truncation leaves one too long for `max_length` (data/encoding.py), its prompt at
    `max_prompt_length` tokens and both responses at `max_length - max_prompt_length`. Rows hold prompt +
    chosen and prompt + rejected, or with `share_prompt` one row per pair, the prompt once and both
    responses: longer than `max_length`. The memory estimate and the cost prediction size a step by these
    before any data is read. (A pair that needed no cut can make a longer prefix-shared row, up to
    `2 * max_length - 1` tokens, when its prompt is short and both its responses long.)"""
    response = max_length - max_prompt_length
    if share_prompt:
        return Rows(pairs, max_prompt_length + 2 * response, 2 * pairs * response)
    return Rows(2 * pairs, max_length, 2 * pairs * response)


def longest_rows_of(cfg) -> Rows:
    """`longest_rows` of a resolved config's micro-batch, data limits and row layout."""
    return longest_rows(cfg.train.micro_batch_size, cfg.data.max_length, cfg.data.max_prompt_length,
                        share_prompt=cfg.train.share_prompt)
