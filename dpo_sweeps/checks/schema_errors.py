"""A config that does not fit the schema, as one InvalidConfig naming the key (Hydra's report takes several lines).

Used where a config is composed: the CLI (dpo_sweeps/__main__.py) for a single run and a sweep's
shared overrides, launchers/jobs.py for each point of a sweep. Imports no training stack.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any

from omegaconf import DictConfig
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from dpo_sweeps.dpo.losses import NAMES, foreign_key
from dpo_sweeps.errors import InvalidConfig

# Example values for a required setting left unset (???); other settings' examples come from their type.
EXAMPLES = {
    "data.path": "/data/prefs.jsonl (a file or folder), or a hub dataset such as Anthropic/hh-rlhf",
    "model.name_or_path": "gpt2",
    "model.block_name": "GPT2Block",
}
TYPE_EXAMPLES = {"int": "1", "float": "0.1", "bool": "true", "str": "a name"}
TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
              "dict[str, Any]": "a mapping {key: value}", "Any": "any value"}


def _field_type(node_type: object, key: str) -> str | None:
    if not dataclasses.is_dataclass(node_type):
        return None
    for f in dataclasses.fields(node_type):
        if f.name == key:
            return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return None


def _accepted_type(type_name: str | None) -> str:
    if type_name is None:
        return "a value of the type in dpo_sweeps/config/schema.py"
    optional = type_name.endswith(" | None")
    inner = type_name.removesuffix(" | None")
    word = TYPE_WORDS.get(inner, f"a {inner}")
    return f"{word}, or null" if optional else word


def schema_refusal(exc: BaseException) -> InvalidConfig | None:
    """The InvalidConfig for an OmegaConf key or type error in `exc` or its cause; None for any other error."""
    cause = exc if isinstance(exc, OmegaConfBaseException) else exc.__cause__
    if not isinstance(cause, OmegaConfBaseException) or not getattr(cause, "full_key", None):
        return None
    setting = str(cause.full_key)
    parent, key = (setting.rsplit(".", 1) + [""])[:2] if "." in setting else ("", setting)
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)):
        node = getattr(cause, "parent_node", None)
        keys = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
        if parent == "loss" and keys and node.get("name") in NAMES:  # a hyperparameter of another loss
            return foreign_key(key, node.name, keys)
        if not keys:
            return InvalidConfig(setting, "not a setting", "the keys listed in INTERFACE.md")
        close = difflib.get_close_matches(key, keys, n=1)
        hint = f"did you mean {parent + '.' if parent else ''}{close[0]}? " if close else ""
        return InvalidConfig(setting, "not a setting", f"{hint}{parent or 'the config'} has {', '.join(keys)}")
    if isinstance(cause, MissingMandatoryValue):
        return InvalidConfig(setting, "required, and not set (???)", f"a value, e.g. {setting}={_example(setting)}")
    if isinstance(cause, ValidationError):
        problem = str(cause.msg).splitlines()[0] if cause.msg else type(cause).__name__
        return InvalidConfig(setting, problem, _accepted_type(_field_type(cause.object_type, key)))
    return None



def _example(setting: str) -> str:
    """An example value of `setting`: EXAMPLES, else its default in the schema, else the value a shipped
    config gives it (one the checks accept), else one of its schema type."""
    if setting in EXAMPLES:
        return EXAMPLES[setting]
    shipped = _schema_default(setting) or _shipped_value(setting)
    if shipped is not None:
        return shipped
    from dpo_sweeps.config import data_schema, schema

    names = {**vars(schema), **vars(data_schema)}
    node: Any = schema.Config
    type_name = None
    for part in setting.split("."):
        if type_name == "Any":  # data: typed per source; look the key up in the source that has it
            node = next((c for c in data_schema.DATA_SCHEMAS.values()
                         if part in {f.name for f in dataclasses.fields(c)}), None)
        type_name = _field_type(node, part)
        node = names.get(type_name, type_name)
    inner = (type_name or "").removesuffix(" | None")
    return TYPE_EXAMPLES.get(inner, "a value of the type in dpo_sweeps/config/schema.py")


def _schema_default(setting: str) -> str | None:
    """The default the schema gives `setting` (a field made with `setting(...)` has its own), as typed on a
    command line; None when conf/ sets it."""
    from omegaconf import MISSING

    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.config.section import setting_fields

    default = next((f.default for key, _, f in setting_fields(Config) if key == setting), None)
    if default is None or default is dataclasses.MISSING or default == MISSING:
        return None
    return str(default).lower() if isinstance(default, bool) else str(default)


def _shipped_value(setting: str) -> str | None:
    """The value conf/config.yaml or a file of the setting's group (the default option first) gives `setting`."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from dpo_sweeps.config import config_dir

    conf = Path(config_dir())
    group, _, key = setting.partition(".")
    defaults = OmegaConf.to_container(OmegaConf.load(conf / "config.yaml")).get("defaults", [])
    default = next((d[group] for d in defaults if isinstance(d, dict) and group in d), None)
    files = [(conf / "config.yaml", setting)] + [
        (f, key) for f in sorted((conf / group).glob("*.yaml"), key=lambda f: (f.stem != default, f.stem))]
    for path, name in files:
        try:
            value = OmegaConf.select(OmegaConf.load(path), name, default=None, throw_on_missing=False)
        except Exception:  # an example is a courtesy: a file that does not load gives none
            continue
        if value is not None and not OmegaConf.is_config(value) and "${" not in str(value) and str(value) != "???":
            return str(value).lower() if isinstance(value, bool) else str(value)
    return None


def _group_options() -> dict[str, list[str]]:
    """Every config group in conf/, with the names of its options."""
    from pathlib import Path

    from dpo_sweeps.config import config_dir

    return {p.name: sorted(f.stem for f in p.glob("*.yaml")) for p in Path(config_dir()).iterdir() if p.is_dir()}


def group_refusal(exc: BaseException, overrides: list[str]) -> InvalidConfig | None:
    """The InvalidConfig for a config group given a value that is not an option's name (`model=null`,
    `data=1`), which Hydra reports as a bare ValueError; None for any other error."""
    if not (isinstance(exc, ValueError) and str(exc).startswith("Config group override must be")):
        return None
    groups = _group_options()
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key in groups and value not in groups[key]:  # Hydra parsed it as null, a number or a bool
            return InvalidConfig(key, f"got {value!r}: a config group takes the name of one of its options",
                                 ", ".join(groups[key]))
    return None


def _composed_groups() -> dict[str, list[str]]:
    """The config groups every run composes (conf/config.yaml's defaults list), each with its options."""
    from pathlib import Path

    from omegaconf import OmegaConf

    from dpo_sweeps.config import config_dir

    named = {next(iter(entry)) for entry in OmegaConf.load(Path(config_dir()) / "config.yaml").defaults
             if not isinstance(entry, str) and len(entry) == 1}
    return {name: options for name, options in _group_options().items() if name in named}


def removed_group_refusal(overrides: list[str]) -> InvalidConfig | None:
    """The InvalidConfig for an override that removes a group every run composes (`~data`, `~model=tiny_gpt2`,
    `~loss@loss`), None if there is none. Hydra takes it; the run would then fail later, on the first setting
    of the missing section it reads, with a run directory already made."""
    groups = None
    for override in overrides:
        if not override.startswith("~"):
            continue
        groups = groups if groups is not None else _composed_groups()
        key = override[1:].partition("=")[0].partition("@")[0]
        if key in groups:
            return InvalidConfig(key, f"{override.partition('=')[0]} removes it, and every run needs one",
                                 f"{key}={'|'.join(groups[key])} to choose another")
    return None


def one_line_message(exc: BaseException) -> str:
    """Hydra's own error (a group option that does not exist, an override it cannot parse) in one line."""
    text = str(exc).strip()
    missing = re.search(r"Could not find '([^'/]+)/([^']+)'", text)
    if missing and "Available options" in text:
        group, name = missing.groups()
        listed = text.split("Available options", 1)[1].split("Config search path", 1)[0]
        options = [line.strip() for line in listed.splitlines()[1:] if line.strip()]
        close = difflib.get_close_matches(name, options, n=1)
        hint = f"did you mean {group}={close[0]}? " if close else ""
        return str(InvalidConfig(group, f"no option '{name}' in conf/{group}", hint + ", ".join(options)))
    lines = [line.strip() for line in text.split("Config search path:", 1)[0].splitlines() if line.strip()]
    message = " ".join(lines) or type(exc).__name__
    # "Error merging override X" says which override, its cause why (OmegaConf's refusal).
    cause = exc.__cause__
    deleted = re.fullmatch(r"Error merging override ~([\w.]+)(=.*)?", message)
    if deleted and "does not support deletion" in str(cause):
        return str(InvalidConfig(deleted.group(1), "a setting of the schema cannot be deleted (~)",
                                 f"{deleted.group(1)}=<a value>, or null where it takes null"))
    if cause is not None and str(cause).strip() and str(cause).strip() not in message:
        message += f": {str(cause).strip().splitlines()[0]}"
    return message
