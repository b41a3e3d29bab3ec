"""A config that does not fit the schema, as one InvalidConfig naming the key (Hydra's report takes several lines).

Used where a config is composed: the CLI (dpo_sweeps/__main__.py) for a single run and a sweep's
shared overrides, launchers/jobs.py for each point of a sweep. Imports no training stack.
"""

from __future__ import annotations

import dataclasses
import difflib

from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from dpo_sweeps.dpo.losses import NAMES, foreign_key
from dpo_sweeps.errors import InvalidConfig

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
    if isinstance(cause, ValidationError):
        problem = str(cause.msg).splitlines()[0] if cause.msg else type(cause).__name__
        return InvalidConfig(setting, problem, _accepted_type(_field_type(cause.object_type, key)))
    return None
