"""A run's preference rows tokenized as the run tokenizes them: the one chain from rows to token ids.

Two readers need it: the run (train/setup.py, every pair) and the forecast (cost/data_lengths.py, a
seeded sample), which prices a step by the lengths the run will see. One chain keeps them equal: the same
tokenizer (a BPE trained on every training row, as the run trains it), the same chat template, the same
truncation, and the same pairs dropped once truncation leaves chosen and rejected identical.

It sits above data/ and models/ (the readers and the tokenizer builder), which import nothing of each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpo_sweeps.data.encoding import ChatFormat, EncodedPair, chat_format, encode_pairs, render_pair
from dpo_sweeps.data.row_checks import DroppedRows, drop_identical_after_truncation
from dpo_sweeps.data.sources import PreferenceRows
from dpo_sweeps.models.build import build_tokenizer


@dataclass(frozen=True)
class PairTokenizer:
    """The run's tokenizer and chat template, and the data settings that cut its pairs."""

    tokenizer: Any
    chat: ChatFormat | None
    data: Any  # the config's DataConfig

    @property
    def end_of_turn(self) -> str | None:
        return self.chat.end_of_turn if self.chat else None

    def encode(self, rows: list, where: list, dropped: DroppedRows) -> tuple[list[EncodedPair], int]:
        """`rows` tokenized and truncated as the run does, with the pairs truncation made identical dropped
        (counted in `dropped`, `where` naming each row's place in its file); and how many were truncated."""
        data = self.data
        pairs, truncated = encode_pairs(
            [render_pair(r, self.chat, hh_dialogue=data.name == "hh") for r in rows], self.tokenizer,
            max_length=data.max_length, max_prompt_length=data.max_prompt_length,
            truncation_mode=data.truncation_mode, end_of_turn=self.end_of_turn)
        return drop_identical_after_truncation(pairs, where, dropped), truncated


def pair_tokenizer(cfg: Any, rows: PreferenceRows) -> PairTokenizer:
    """The run's tokenizer for these rows: a BPE is trained on every training row (and cached), as the run's is."""
    plain = [render_pair(r) for r in rows.train] if cfg.model.tokenizer.kind == "bpe" else []
    tokenizer = build_tokenizer(cfg.model, [p + c + r for p, c, r in plain])
    return PairTokenizer(tokenizer, chat_format(tokenizer, cfg.data.chat_template), cfg.data)
