"""The schema of `data`: one dataclass per kind of source, each conf/data file naming its own.

The sources share the keys of DataConfig; the synthetic task adds its generator's knobs, files and
hub datasets add where to read them. conf/data/<file>.yaml starts with `defaults: [/schema/data/<kind>@_here_]`.
A resolved config's `data` is read as the one whose keys it has (`data_config`); each field is a `setting`
(config/setting.py: what it accepts, when a run reads it), and each source checks its own fields (`check`);
whether data.path is there is checks/validate.py's (it resolves it against the command's directory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from dpo_sweeps.config.section import Section, at_least, refuse
from dpo_sweeps.config.setting import Accepted, AtLeast, OneOf, ReadWhen, Rule, setting

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


class ChatTemplate(Accepted):
    """data.chat_template's values, as YAML or a command line gives them (chat_template_setting)."""

    text = ", ".join(CHAT_TEMPLATE_SETTINGS)

    def check(self, value: Any, setting: str) -> None:
        chat_template_setting(value)


# The synthetic task's generator reads none of the keys that say which rows to read and which to hold out.
_SYNTHETIC = ReadWhen(lambda c, _: c.data.name == "synthetic", "the synthetic task generates its own train and eval "
                      "pairs", "data=hh or data=preference to read files; data.num_train_pairs and data.num_eval_pairs")


# data.data_dir, a hub dataset's subset folder. Whether data.path is local is the data sources' call
# (data/sources.py looks_local, and the disk), so checks/unused.py decides the rule.
_LOCAL_PATH = ReadWhen(Rule("local_data_path"), "a local data.path has no subset folders of a hub dataset",
                       "a hub dataset name in data.path, or the subset's own folder as data.path")


@dataclass
class DataConfig(Section):
    """data=<conf/data file>: the preference pairs a run trains and evaluates on, and how they become tokens."""

    at = "data"

    # The keys left MISSING (`???`) are those every conf/data file sets: a source is chosen as a whole, so the
    # schema holds no default of its own for them.
    name: str = setting()
    """The source's reader: synthetic | hh | preference."""
    path: str | None = setting(read_when=_SYNTHETIC)
    """A hub dataset name, or a local .jsonl / .jsonl.gz / .json / .parquet file or folder of them
    (relative paths resolve against the directory the command ran in); null for synthetic."""
    split: str = setting(read_when=_SYNTHETIC)
    """The split to train on (a source with one split: that one)."""
    eval_split: str | None = setting(read_when=_SYNTHETIC)
    """The source's own held-out split; null (or absent from the source): hold out eval_size pairs."""
    eval_size: Any = setting(read_when=_SYNTHETIC)
    """Pairs held out when there is no eval split: auto (256, at most a fifth of a source under 1,280
    pairs, at least 1), a number of pairs >= 1, or a fraction in (0, 1)."""
    split_seed: int = setting(read_when=_SYNTHETIC)
    """Seed of the held-out split's permutation."""
    max_pairs: int | None = setting(accepted=AtLeast(1, "an integer >= 1, or null for all", null=True),
                                    read_when=_SYNTHETIC)
    """Train on at most this many pairs (>= 1); null: all."""
    max_length: int = setting(accepted=AtLeast(2))
    """Tokens of prompt + response kept per sequence (>= 2)."""
    max_prompt_length: int = setting()
    """Tokens of the prompt kept (>= 1, < max_length)."""
    truncation_mode: str = setting(accepted=OneOf(TRUNCATION_MODES))
    """Which end of an over-long prompt is kept: keep_start | keep_end."""
    length_grouped: bool = setting(True)
    """Batches of pairs of similar length: each window of length_group_window global batches is sorted
    by length, cut into batches and the batches shuffled (still a pure function of the step)."""
    length_group_window: int = setting(32, read_when=ReadWhen(
        lambda c, _: not c.data.length_grouped, "windows group pairs by length only with data.length_grouped",
        "data.length_grouped=true"))
    """With length_grouped: global batches per sorted window (>= 1)."""
    chat_template: str = setting("auto", accepted=ChatTemplate(), older_runs_lack=True)
    """How dialogues (HH transcripts, {role, content} message rows) become text: true renders them with
    the tokenizer's chat template (the prompt ends where the template opens the assistant's turn, each
    response ends with the template's end-of-turn token instead of EOS; a tokenizer without a template is
    an error); false, plain text (HH as written, messages as "role: content" lines); auto: true when the
    tokenizer has a chat template, else false. Plain-text prompt/chosen/rejected rows stay as they are."""

    def check(self) -> None:
        """The lengths, each field's accepted values (its `setting`), then the values only some configs check:
        the window only where pairs are grouped by length, eval_size only where pairs are read."""
        check_lengths(self.max_length, self.max_prompt_length)
        super().check()
        if self.length_grouped:
            at_least(self.length_group_window, 1, "data.length_group_window",
                     "an integer >= 1 (global batches per window)")
        if self.name != "synthetic":
            check_eval_size(self.eval_size)


@dataclass
class SyntheticDataConfig(DataConfig):
    """data=synthetic: a preference task dpo-sweeps generates (data/synthetic.py)."""

    num_train_pairs: int = setting(accepted=AtLeast(1))
    """Training pairs generated (>= 1)."""
    num_eval_pairs: int = setting(accepted=AtLeast(1))
    """Held-out pairs generated, from their own stream (>= 1)."""
    num_topics: int = setting(accepted=AtLeast(1))
    """Topics, each liking its own half of the letters a-z (>= 1)."""
    prompt_letters: int = setting(accepted=AtLeast(0))
    """Letters of a prompt."""
    response_letters: int = setting(accepted=AtLeast(
        1, "an integer >= 1 (with no letters chosen and rejected are the same empty answer)"))
    """Letters of a response."""
    noise: float = setting()
    """Chance that the chosen answer draws from the disliked half, in [0, 0.5) (at 0.5 there is nothing to learn); 0 is easiest."""
    seed: int = setting()
    """Seed of the generator."""

    def check(self) -> None:
        """Also what leaves nothing to learn, refused as loss.beta=0 is."""
        super().check()
        if not 0.0 <= self.noise <= 0.5:
            refuse("data.noise", f"got {self.noise}", "a number in [0, 0.5); 0 is easiest")
        if self.noise == 0.5:
            refuse("data.noise", "0.5 draws chosen and rejected answers alike: nothing to learn",
                   "a number in [0, 0.5); 0 is easiest")


@dataclass
class HubDataConfig(DataConfig):
    """data=hh (and the base of data=preference): pairs read from a hub dataset or local files."""

    data_dir: str | None = setting(read_when=_LOCAL_PATH)
    """Hub only: a subset folder of the dataset repository (e.g. harmless-base); null: the whole dataset."""


@dataclass
class PreferenceDataConfig(HubDataConfig):
    """data=preference: rows of prompt, chosen and rejected columns, named here."""

    prompt_column: str = setting()
    """The column holding the prompt: plain text, or a list of {role, content} messages."""
    chosen_column: str = setting()
    """The column holding the preferred response."""
    rejected_column: str = setting()
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
