"""The schema of `data`: one dataclass per kind of source, each conf/data file naming its own.

The sources share the keys of DataConfig; the synthetic task adds its generator's knobs, files and
hub datasets add where to read them. conf/data/<file>.yaml starts with `defaults: [/schema/data/<kind>@_here_]`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING


@dataclass
class DataConfig:
    name: str = MISSING
    """The source's reader: synthetic | hh | preference."""
    path: str | None = MISSING
    """A hub dataset name, or a local .jsonl / .jsonl.gz / .json / .parquet file or folder of them
    (relative paths resolve against the directory the command ran in); null for synthetic."""
    split: str = MISSING
    """The split to train on (a source with one split: that one)."""
    eval_split: str | None = MISSING
    """The source's own held-out split; null (or absent from the source): hold out eval_size pairs."""
    eval_size: Any = MISSING
    """Pairs held out when there is no eval split: auto (256, at most a fifth of a source under 1,280
    pairs, at least 1), a number of pairs >= 1, or a fraction in (0, 1)."""
    split_seed: int = MISSING
    """Seed of the held-out split's permutation."""
    max_pairs: int | None = MISSING
    """Train on at most this many pairs (>= 1); null: all."""
    max_length: int = MISSING
    """Tokens of prompt + response kept per sequence (>= 2)."""
    max_prompt_length: int = MISSING
    """Tokens of the prompt kept (>= 1, < max_length)."""
    truncation_mode: str = MISSING
    """Which end of an over-long prompt is kept: keep_start | keep_end."""
    length_grouped: bool = MISSING
    """Batches of pairs of similar length: each window of length_group_window global batches is sorted
    by length, cut into batches and the batches shuffled (still a pure function of the step)."""
    length_group_window: int = MISSING
    """With length_grouped: global batches per sorted window (>= 1)."""
    chat_template: str = "auto"
    """How dialogues (HH transcripts, {role, content} message rows) become text: true renders them with
    the tokenizer's chat template (the prompt ends where the template opens the assistant's turn, each
    response ends with the template's end-of-turn token instead of EOS; a tokenizer without a template is
    an error); false, plain text (HH as written, messages as "role: content" lines); auto: true when the
    tokenizer has a chat template, else false. Plain-text prompt/chosen/rejected rows stay as they are."""


@dataclass
class SyntheticDataConfig(DataConfig):
    num_train_pairs: int = MISSING
    """Training pairs generated (>= 1)."""
    num_eval_pairs: int = MISSING
    """Held-out pairs generated, from their own stream (>= 1)."""
    num_topics: int = MISSING
    """Topics, each liking its own half of the letters a-z (>= 1)."""
    prompt_letters: int = MISSING
    """Letters of a prompt."""
    response_letters: int = MISSING
    """Letters of a response."""
    noise: float = MISSING
    """Chance that the chosen answer draws from the disliked half, in [0, 0.5) (at 0.5 there is nothing to learn); 0 is easiest."""
    seed: int = MISSING
    """Seed of the generator."""


@dataclass
class HubDataConfig(DataConfig):
    data_dir: str | None = MISSING
    """Hub only: a subset folder of the dataset repository (e.g. harmless-base); null: the whole dataset."""


@dataclass
class PreferenceDataConfig(HubDataConfig):
    prompt_column: str = MISSING
    """The column holding the prompt: plain text, or a list of {role, content} messages."""
    chosen_column: str = MISSING
    """The column holding the preferred response."""
    rejected_column: str = MISSING
    """The column holding the dispreferred response."""


# conf/data files by the schema they name: /schema/data/<key>.
DATA_SCHEMAS: dict[str, type] = {
    "synthetic": SyntheticDataConfig,
    "hub": HubDataConfig,
    "preference": PreferenceDataConfig,
}
