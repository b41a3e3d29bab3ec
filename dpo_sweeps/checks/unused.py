"""When each setting is read: every key of the schema, always or only beside other choices, in one table.

Settings given on the command line that the chosen config would not read are refused, never ignored.
The schema refuses a key no config has (`train.lr_rate`); `READ_WHEN` says, for every key the schema
has (config/schema.py, config/data_schema.py, dpo/losses/schema.py), whether a run reads it always
(`ALWAYS`) or only under a condition (a `ReadOnlyWhen`: `fsdp.hybrid_group_size` only with
`fsdp=hybrid_shard`). A field made with `setting(...)` (config/setting.py) says it in its own metadata
(`read_when`; none: always), and the table is made from the schema (`read_when_table`). The keys of
`model`, `data` and `loss` (typed per source and per loss), and the conditions that need a library to
decide (which losses have a reference), are `RULES` and `ALWAYS_READ` here. A key of neither fails
tests/unit/test_settings_table.py; tests/integration/test_settings_read.py runs real configs with a
recorder of the keys they read and finds every key they left unread refused here.

Who starts the ranks matters to two keys (`Launch`, config/setting.py): torchrun and a sweep launcher's
multi-rank jobs pick their own rendezvous port, and torchrun and SLURM bind their ranks to cores themselves
(resources.master_port and bind_cores say so in their fields).

A setting is refused only when the user set it (`overrides`): the files in conf/ carry every key with a
value. A sweep's setting may act at some of its points only (`fsdp=full_shard,hybrid_shard
fsdp.hybrid_group_size=2`): it is refused only when no point reads it (`SettingsRead`, fed each point
by the sweep's pre-launch check, launchers/preflight.py; an Optuna study, whose trials are drawn as it
goes, feeds it the points its search space can produce: launchers/optuna_space.py `SearchSpace.points`).

A probe (`probe.steps`, train/probe.py) replaces `PROBE_REPLACES` with its own values: they are not
refused there, since a probe is the full run's own command plus probe.steps.

A renamed key (config/tracking_schema.py RENAMED: `wandb.mode` is tracking.wandb.mode) is checked as its new name,
with a one-line notice of the rename; its old section, read by no code, is always in `unread_keys`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from dpo_sweeps.config.schema import Config
from dpo_sweeps.config.section import Section, setting_fields
from dpo_sweeps.config.setting import Launch, setting_of
from dpo_sweeps.config.tracking_schema import renamed_key
from dpo_sweeps.errors import InvalidConfig

__all__ = ["ALWAYS", "READ_WHEN", "Launch", "ReadOnlyWhen", "SettingsRead", "check_settings_used", "field_of",
           "given_keys", "read_when_table", "unread_keys", "unread_rule"]

SYNTHETIC_OWN_SPLIT = "the synthetic task generates its own train and eval pairs"


@dataclass(frozen=True)
class ReadOnlyWhen:
    """Keys a run reads only when `unused` is false."""

    keys: tuple[str, ...]
    unused: Callable[[Config, Launch], bool]  # true: the chosen config does not read these keys
    why: str  # why not, for the message
    instead: str  # what would make them act, or what acts instead


ALWAYS = "always"


def _local_path(cfg: Config, _: Launch) -> bool:
    from dpo_sweeps.data.sources import looks_local

    path = cfg.data.path
    return bool(path) and (looks_local(str(path)) or Path(str(path)).expanduser().exists())


def _mix_terms(cfg: Config) -> list[str]:
    """A mix's term names (terms the loss schema could not type, which validation refuses, as given)."""
    if cfg.loss.name != "mix":
        return []
    return [term.name if isinstance(term, Section) else term.get("name") if isinstance(term, Mapping) else None
            for term in cfg.loss.terms]


def _nll_unused(cfg: Config, _: Launch) -> bool:
    """No NLL term: sft_weight 0 (a loss with an NLL modifier), or a mix without an sft term."""
    loss = cfg.loss
    if loss.name == "mix":
        return "sft" not in _mix_terms(cfg)
    return getattr(loss, "sft_weight", None) == 0  # a loss without sft_weight has no nll_average either


def _mix_without(key: str) -> Callable[[Config, Launch], bool]:
    """A mix none of whose terms takes `key` (their specs in the loss registry)."""
    def unused(cfg: Config, _: Launch) -> bool:
        from dpo_sweeps.dpo.losses.registry import LOSSES

        return cfg.loss.name == "mix" and not any(t in LOSSES and key in LOSSES[t].keys for t in _mix_terms(cfg))
    return unused


def _alpha_unused(cfg: Config, launch: Launch) -> bool:
    return getattr(cfg.loss, "f_divergence", None) != "alpha_divergence" or _mix_without("f_divergence")(cfg, launch)


def _init_from_full_model(cfg: Config) -> bool:
    """model.init_from names a run that saved a whole model (not adapters, whose base model.* builds)."""
    from dpo_sweeps.models.adapters import start_adapter

    return cfg.model.init_from is not None and start_adapter(cfg.model) is None


def _no_reference(cfg: Config, _: Launch) -> bool:
    from dpo_sweeps.dpo.losses import uses_reference

    return not uses_reference(cfg.loss)


RULES = (
    ReadOnlyWhen(("model.from_config", "model.gguf_file", "model.tokenizer.kind", "model.tokenizer.vocab_size",
                  "model.install_hint"), lambda c, _: _init_from_full_model(c),
                 "model.init_from's saved model brings its own architecture and tokenizer", "model.init_from=null"),
    ReadOnlyWhen(("model.tokenizer.vocab_size",), lambda c, _: c.model.tokenizer.kind != "bpe",
                 "only a trained BPE has a vocabulary size to choose", "model.tokenizer.kind=bpe"),
    ReadOnlyWhen(("model.install_hint",), lambda c, _: c.model.gguf_file is None,
                 "it is shown only when a model.gguf_file cannot be found", "a model.gguf_file"),
    ReadOnlyWhen(("data.length_group_window",), lambda c, _: not c.data.length_grouped,
                 "windows group pairs by length only with data.length_grouped", "data.length_grouped=true"),
    ReadOnlyWhen(("data.data_dir",), _local_path, "a local data.path has no subset folders of a hub dataset",
                 "a hub dataset name in data.path, or the subset's own folder as data.path"),
    ReadOnlyWhen(("data.path", "data.split", "data.eval_split", "data.eval_size", "data.split_seed", "data.max_pairs"),
                 lambda c, _: c.data.name == "synthetic", SYNTHETIC_OWN_SPLIT,
                 "data=hh or data=preference to read files; data.num_train_pairs and data.num_eval_pairs"),
    ReadOnlyWhen(("train.precompute_reference_logps",), _no_reference,
                 "this loss has no reference model to score", "a loss with a reference, reference_free=false"),
    ReadOnlyWhen(("train.reference_sync.every_steps", "train.reference_sync.alpha"), _no_reference,
                 "this loss has no reference model to sync", "a loss with a reference, reference_free=false"),
    ReadOnlyWhen(("loss.f_divergence",), _mix_without("f_divergence"),
                 "no term of this mix has an f-divergence form", "a term such as sigmoid"),
    ReadOnlyWhen(("loss.f_alpha_divergence_coef",), _alpha_unused,
                 "it is alpha_divergence's alpha", "loss.f_divergence=alpha_divergence"),
    ReadOnlyWhen(("loss.nll_average",), _nll_unused, "there is no NLL term (loss.sft_weight=0, or a mix without sft)",
                 "loss.sft_weight > 0, or an sft term"),
    ReadOnlyWhen(("loss.reference_free",), _mix_without("reference_free"),
                 "no term of this mix compares with a reference", "a term such as sigmoid"),
)

# Every key of the schema not made with `setting` that every run reads (with a value that is its choice: null too).
ALWAYS_READ = (
    "model.name_or_path", "model.block_name", "model.init_from",
    "data.name", "data.max_length", "data.max_prompt_length", "data.truncation_mode", "data.length_grouped",
    "data.chat_template", "data.num_train_pairs", "data.num_eval_pairs", "data.num_topics", "data.prompt_letters",
    "data.response_letters", "data.noise", "data.seed", "data.prompt_column", "data.chosen_column",
    "data.rejected_column",
    "loss.name", "loss.terms", "loss.beta", "loss.label_smoothing", "loss.length_normalized", "loss.discopop_tau",
    "loss.gamma", "loss.sft_weight", "loss.ld_alpha",
)

# Keys a probe run replaces (train/probe.py); not refused there (see above).
PROBE_REPLACES = ("train.max_steps", "train.eval_every", "train.save_model", "train.eval_max_pairs",
                  "train.zero_shot_eval", "train.sample_prompts", "train.sample_max_new_tokens",
                  "checkpoint.every_steps", "checkpoint.keep_last", "checkpoint.keep_when_completed")


def _renamed(cfg: Config, _: Launch) -> bool:
    return True  # no code reads a renamed key's old section: Config.of moved its values to the new name


@cache
def read_when_table(config_type: type = Config) -> dict[str, str | list[ReadOnlyWhen]]:
    """Every key of `config_type`'s schema: ALWAYS, or the rules under which a run does not read it: the
    `read_when` of a field made with `setting`, after RULES' (a field with neither is read always), and the
    table above for the rest."""
    table: dict[str, str | list[ReadOnlyWhen]] = {key: ALWAYS for key in ALWAYS_READ}
    for rule in RULES:
        for key in rule.keys:
            rules = table.setdefault(key, [])
            assert rules != ALWAYS, f"{key}: both always read and read only when"
            rules.append(rule)
    for key, _, field in setting_fields(config_type):
        spec = setting_of(field)
        if renamed_key(key) != key:
            table[key] = [ReadOnlyWhen((key,), _renamed, f"it is {renamed_key(key)} now",
                                       f"{renamed_key(key)}; the old name is accepted for one release")]
        elif spec is not None:
            assert table.get(key) != ALWAYS, f"{key}: made with setting(), and in ALWAYS_READ"
            rules = table.setdefault(key, [])
            rules.extend(ReadOnlyWhen((key,), w.unused, w.why, w.instead) for w in spec.read_when)
            if not rules:
                table[key] = ALWAYS
    return table


READ_WHEN = read_when_table(Config)


def field_of(key: str, table: Mapping[str, object] = READ_WHEN) -> str | None:
    """The schema key a dotted override key sets (`model.from_config.n_layer` -> model.from_config)."""
    parts = key.split(".")
    for end in range(len(parts), 1, -1):
        if ".".join(parts[:end]) in table:
            return ".".join(parts[:end])
    return None


def override_key(override: str) -> str | None:
    """The dotted key an override sets (`+a.b=1` -> a.b); None for group choices, deletions and Hydra's keys."""
    if "=" not in override or override.startswith("~"):
        return None
    key = override.split("=", 1)[0].lstrip("+").strip()
    if "." not in key or "/" in key or key.startswith("hydra.") or "@" in key:
        return None
    return key


def given_keys(overrides: list[str], config_type: type = Config) -> set[str]:
    """The schema keys `overrides` set that are read only under a condition (a renamed key by its new name)."""
    table = read_when_table(config_type)
    fields = (field_of(renamed_key(k), table) for k in (override_key(o) for o in overrides) if k is not None)
    return {f for f in fields if f is not None and table[f] != ALWAYS}


def renamed_keys(overrides: list[str]) -> list[str]:
    """The keys `overrides` set by a name that has changed (config/tracking_schema.py RENAMED)."""
    return [k for k in (override_key(o) for o in overrides) if k is not None and renamed_key(k) != k]


def rename_notice(keys: list[str]) -> str:
    """The one line that tells a user their old keys' new names."""
    shown = ", ".join(f"{key} is now {renamed_key(key)}" for key in keys)
    return f"notice: {shown} (the old names are accepted until the next release)"


def _say_renamed(overrides: list[str]) -> bool:
    """Print the rename notice for `overrides` once, on rank 0 only (torchrun's ranks all check); whether
    there was one."""
    keys = renamed_keys(overrides)
    if keys and os.environ.get("RANK", "0") == "0":
        print(rename_notice(keys), file=sys.stderr)
    return bool(keys)


def unread_rule(key: str, cfg: Config, launch: Launch) -> ReadOnlyWhen | None:
    """The rule under which `cfg` does not read `key`, or None (it reads it)."""
    rules = read_when_table(type(cfg)).get(key, ALWAYS)
    if rules == ALWAYS or (key in PROBE_REPLACES and cfg.probe.steps > 0):
        return None
    return next((rule for rule in rules if rule.unused(cfg, launch)), None)


def unread_keys(cfg: Config, launch: Launch = Launch.DPO_SWEEPS) -> set[str]:
    """Every schema key `cfg` has and does not read: what the check refuses when set on the command line."""
    return {key for key in read_when_table(type(cfg)) if _has(cfg, key) and unread_rule(key, cfg, launch) is not None}


def _has(cfg: Config, key: str) -> bool:
    """Whether `cfg` has the schema key `key` (a field of its typed section: `loss` has its loss's keys only)."""
    node: object = cfg
    for part in key.split("."):
        if not isinstance(node, Section) or part not in {f.name for f in fields(node)}:
            return False
        node = getattr(node, part)
    return True


def unread(key: str, rule: ReadOnlyWhen, where: str) -> InvalidConfig:
    """The refusal of `key`, set but not read `where`."""
    return InvalidConfig(key, f"set, but not read {where}: {rule.why}", f"{rule.instead}; or leave {key} out")


def check_settings_used(cfg: Config, overrides: list[str], launch: Launch = Launch.DPO_SWEEPS) -> None:
    """Raise InvalidConfig for the first setting in `overrides` the chosen config would not read (a renamed
    key is checked by its new name, after a one-line notice)."""
    _say_renamed(overrides)
    table = list(read_when_table(type(cfg)))
    for key in sorted(given_keys(overrides, type(cfg)), key=table.index):
        rule = unread_rule(key, cfg, launch)
        if rule is not None:
            raise unread(key, rule, "here")


class SettingsRead:
    """For a sweep: the governed settings its points give that no point has read yet. Each point's
    config is looked at only while one of its given keys is still unread, so a sweep of thousands of
    points that reads its settings at the first pays for one point."""

    def __init__(self, launch: Launch = Launch.LOCAL) -> None:
        self.launch = launch
        self.unread: dict[str, tuple[ReadOnlyWhen, int]] = {}  # key -> (its rule, points that give it unread)
        self.read: set[str] = set()
        self.renamed_said = False

    def add(self, overrides: list[str], config: Callable[[], Config]) -> None:
        if not self.renamed_said:
            self.renamed_said = _say_renamed(overrides)
        pending = given_keys(overrides) - self.read
        if not pending:
            return
        cfg = config()
        for key in pending:
            rule = unread_rule(key, cfg, self.launch)
            if rule is not None:
                self.unread[key] = (rule, self.unread.get(key, (rule, 0))[1] + 1)
            else:
                self.read.add(key)
                self.unread.pop(key, None)

    def check(self, only_point: str = "at the sweep's only point") -> None:
        """Raise InvalidConfig for the first setting given at some points and read at none (`only_point`:
        where, when one point gave it)."""
        for key, (rule, points) in self.unread.items():
            raise unread(key, rule, only_point if points == 1 else f"at any of the {points} points that set it")
