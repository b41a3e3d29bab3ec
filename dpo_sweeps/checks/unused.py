"""When each setting is read: every key of the schema, always or only beside other choices, in one table.

Settings given on the command line that the chosen config would not read are refused, never ignored.
The schema refuses a key no config has (`train.lr_rate`); `READ_WHEN` says, for every key the schema
has (config/schema.py, config/data_schema.py, dpo/losses/schema.py), whether a run reads it always
(`ALWAYS`) or only under a condition (a `ReadOnlyWhen`: `fsdp.hybrid_group_size` only with
`fsdp=hybrid_shard`). Every field is made with `setting(...)` (config/setting.py) and says it in its own
metadata (`read_when`; none: always); the table is made from the schema (`read_when_table`), the keys of
`data` and `loss` from every source's and every loss's schema. A condition that needs a library to decide
(which losses have a reference, whether data.path is local, whether model.init_from saved adapters) is
named in the field (`Rule`) and decided here (`CONDITIONS`), so that config/ imports none of them.
tests/unit/test_settings_table.py checks that every key is in the table; tests/integration/test_settings_read.py
runs real configs with a recorder of the keys they read and finds every key they left unread refused here.

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
from dpo_sweeps.config.setting import Launch, ReadWhen, Rule, setting_of
from dpo_sweeps.config.tracking_schema import renamed_key
from dpo_sweeps.errors import InvalidConfig

__all__ = ["ALWAYS", "CONDITIONS", "READ_WHEN", "Launch", "ReadOnlyWhen", "SettingsRead", "check_settings_used",
           "field_of", "given_keys", "read_when_table", "unread_keys", "unread_rule"]


@dataclass(frozen=True)
class ReadOnlyWhen:
    """Keys a run reads only when `unused` is false."""

    keys: tuple[str, ...]
    unused: Callable[[Config, Launch], bool]  # true: the chosen config does not read these keys
    why: str  # why not, for the message
    instead: str  # what would make them act, or what acts instead


ALWAYS = "always"


def _init_from_full_model(cfg: Config, _: Launch) -> bool:
    """model.init_from names a run that saved a whole model (not adapters, whose base model.* builds)."""
    from dpo_sweeps.models.adapters import start_adapter

    return cfg.model.init_from is not None and start_adapter(cfg.model) is None


def _local_data_path(cfg: Config, _: Launch) -> bool:
    from dpo_sweeps.data.sources import looks_local

    path = cfg.data.path
    return bool(path) and (looks_local(str(path)) or Path(str(path)).expanduser().exists())


def _no_reference(cfg: Config, _: Launch) -> bool:
    from dpo_sweeps.dpo.losses import uses_reference

    return not uses_reference(cfg.loss)


# The read conditions a schema field names (`Rule`, config/setting.py) rather than writes: each needs code of a
# layer above config/ (pyproject.toml's import-linter layers): models/adapters (torch), data/sources, the
# losses' reference use (dpo/losses). Each is imported here only when a rule is decided.
CONDITIONS: dict[str, Callable[[Config, Launch], bool]] = {
    "init_from_full_model": _init_from_full_model,
    "local_data_path": _local_data_path,
    "no_reference": _no_reference,
}


def condition(when: ReadWhen) -> Callable[[Config, Launch], bool]:
    """The test of a field's read condition: its own, or the one CONDITIONS registers under its Rule's name."""
    if not isinstance(when.unused, Rule):
        return when.unused
    if when.unused.name not in CONDITIONS:
        raise KeyError(f"read_when names Rule({when.unused.name!r}), which checks/unused.py CONDITIONS does not "
                       f"decide (it decides: {', '.join(CONDITIONS)})")
    return CONDITIONS[when.unused.name]


# Keys a probe run replaces (train/probe.py); not refused there (see above). Not a condition under which the
# key is read (a probe reads them: its own values), so not the fields' read_when: what a probe replaces is
# train/probe.py's choice, listed here beside the one check that exempts them.
PROBE_REPLACES = ("train.max_steps", "train.eval_every", "train.save_model", "train.eval_max_pairs",
                  "train.zero_shot_eval", "train.sample_prompts", "train.sample_max_new_tokens",
                  "checkpoint.every_steps", "checkpoint.keep_last", "checkpoint.keep_when_completed")


def _renamed(cfg: Config, _: Launch) -> bool:
    return True  # no code reads a renamed key's old section: Config.of moved its values to the new name


@cache
def read_when_table(config_type: type = Config) -> dict[str, str | list[ReadOnlyWhen]]:
    """Every key of `config_type`'s schema (the keys of every source and every loss too): ALWAYS, or the
    rules under which a run does not read it, its field's `read_when` (config/setting.py); a renamed key's
    old name is never read."""
    table: dict[str, str | list[ReadOnlyWhen]] = {}
    for key, _, field in setting_fields(config_type):
        spec = setting_of(field)
        if renamed_key(key) != key:
            table[key] = [ReadOnlyWhen((key,), _renamed, f"it is {renamed_key(key)} now",
                                       f"{renamed_key(key)}; the old name is accepted for one release")]
        elif spec is None:
            raise TypeError(f"{key}: not made with setting(...) (config/setting.py), so when it is read is unknown")
        else:
            rules = [ReadOnlyWhen((key,), condition(w), w.why, w.instead) for w in spec.read_when]
            table[key] = rules or ALWAYS
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
