"""The schema of `data`: one dataclass per kind of source, each conf/data file naming its own.

The sources share the keys of DataConfig; the synthetic task adds its generator's knobs, files and
hub datasets add where to read them. conf/data/<file>.yaml starts with `defaults: [/schema/data/<kind>@_here_]`.
A resolved config's `data` is read as the one whose keys it has (`data_config`); each checks its own
fields (`check`); whether data.path is there is checks/validate.py's (it resolves it against the command's directory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import MISSING

from dpo_sweeps.config.section import Section, at_least, refuse

TRUNCATION_MODES = ("keep_start", "keep_end")
CHAT_TEMPLATE_SETTINGS = ("auto", "true", "false")


def check_lengths(max_length: int, max_prompt_length: int) -> None:
    if not isinstance(max_length, int) or max_length < 2:
        refuse("data.max_length", f"got {max_length!r}", "an integer >= 2")
    if not isinstance(max_prompt_length, int) or not 0 < max_prompt_length < max_length:
        refuse("data.max_prompt_length", f"{max_prompt_length!r} with data.max_length={max_length}",
               f"an integer in [1, {max_length - 1}] (less than data.max_length)")


def check_eval_size(eval_size: Any) -> None:
    if eval_size == "auto":
        return
    if isinstance(eval_size, bool) or not isinstance(eval_size, (int, float)) or eval_size <= 0:
        refuse("data.eval_size", f"got {eval_size!r}", "auto, a number of pairs >= 1 or a fraction in (0, 1)")


def chat_template_setting(setting: Any) -> str:
    """`data.chat_template` as auto | true | false (a YAML or command-line true arrives as "True")."""
    value = str(setting).lower()
    if value not in CHAT_TEMPLATE_SETTINGS:
        refuse("data.chat_template", f"got {setting!r}", ", ".join(CHAT_TEMPLATE_SETTINGS))
    return value


@dataclass
class DataConfig(Section):
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
    length_grouped: bool = True
    """Batches of pairs of similar length: each window of length_group_window global batches is sorted
    by length, cut into batches and the batches shuffled (still a pure function of the step)."""
    length_group_window: int = 32
    """With length_grouped: global batches per sorted window (>= 1)."""
    chat_template: str = "auto"
    """How dialogues (HH transcripts, {role, content} message rows) become text: true renders them with
    the tokenizer's chat template (the prompt ends where the template opens the assistant's turn, each
    response ends with the template's end-of-turn token instead of EOS; a tokenizer without a template is
    an error); false, plain text (HH as written, messages as "role: content" lines); auto: true when the
    tokenizer has a chat template, else false. Plain-text prompt/chosen/rejected rows stay as they are."""

    def check(self) -> None:
        check_lengths(self.max_length, self.max_prompt_length)
        if self.truncation_mode not in TRUNCATION_MODES:
            refuse("data.truncation_mode", f"got {self.truncation_mode!r}", ", ".join(TRUNCATION_MODES))
        if self.length_grouped:
            at_least(self.length_group_window, 1, "data.length_group_window",
                     "an integer >= 1 (global batches per window)")
        if self.max_pairs is not None:
            at_least(self.max_pairs, 1, "data.max_pairs", "an integer >= 1, or null for all")
        chat_template_setting(self.chat_template)
        if self.name != "synthetic":
            check_eval_size(self.eval_size)


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

    def check(self) -> None:
        """Also what leaves nothing to learn, refused as loss.beta=0 is."""
        super().check()
        for key in ("num_train_pairs", "num_eval_pairs", "num_topics"):
            at_least(getattr(self, key), 1, f"data.{key}")
        if not 0.0 <= self.noise <= 0.5:
            refuse("data.noise", f"got {self.noise}", "a number in [0, 0.5); 0 is easiest")
        if self.noise == 0.5:
            refuse("data.noise", "0.5 draws chosen and rejected answers alike: nothing to learn",
                   "a number in [0, 0.5); 0 is easiest")
        at_least(self.response_letters, 1, "data.response_letters",
                 "an integer >= 1 (with no letters chosen and rejected are the same empty answer)")
        at_least(self.prompt_letters, 0, "data.prompt_letters")


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


def data_config(values: Mapping[str, Any]) -> DataConfig:
    """A resolved config's `data`, as the source schema whose keys it has (the smallest that holds them all:
    conf/data/hh.yaml's keys are HubDataConfig's, and PreferenceDataConfig's include them)."""
    keys = set(values)
    holding = [s for s, names in _FIELD_NAMES.items() if keys <= names]
    schema = min(holding, key=lambda s: len(_FIELD_NAMES[s])) if holding else max(
        _FIELD_NAMES, key=lambda s: len(keys & _FIELD_NAMES[s]))
    return schema.of(values)


_FIELD_NAMES = {schema: frozenset(f.name for f in fields(schema)) for schema in DATA_SCHEMAS.values()}
