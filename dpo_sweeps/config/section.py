"""What every section of the config is (schema.py, data_schema.py, dpo/losses/schema.py): a dataclass
Hydra composes into, frozen once built, built from a resolved config by `of`, and checking its own
fields in `check`, each refusal one InvalidConfig line naming the setting and what is accepted."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import FrozenInstanceError, fields
from typing import Any, NoReturn

from dpo_sweeps.errors import InvalidConfig


class Section:
    """A section of the config. Hydra builds it while composing (its fields MISSING until conf/ sets
    them); `of` builds it from a resolved config. Either way it is frozen once built: a resolved config
    does not change (a probe derives its own with dataclasses.replace, train/probe.py). Not
    @dataclass(frozen=True): OmegaConf makes a frozen dataclass's node read-only, and composing merges
    conf/'s values into that node (ReadonlyConfigError)."""

    _frozen = False  # set on the instance once built (a class default: no lookup miss per field set)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if self._frozen:
            raise FrozenInstanceError(f"cannot assign to {type(self).__name__}.{name}: a resolved config does not "
                                      "change (dataclasses.replace derives another)")
        object.__setattr__(self, name, value)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Any:
        """This section of a resolved config (plain containers, as summary.json's `config` holds it). A key
        the section does not declare (added with `+`, read by nothing) stays in the plain config only; a key
        an older run's config lacks takes the schema's default."""
        sections = section_types(cls)
        kwargs = {}
        for key, value in values.items():
            if key in sections:
                section = sections[key]
                kwargs[key] = section.of(value) if section is not None and isinstance(value, Mapping) else value
        return cls(**kwargs)

    def check(self) -> None:
        """Refuse the first field whose value this section does not accept (InvalidConfig, one line)."""


_SECTIONS: dict[type, dict[str, Any]] = {}


def section_types(cls: type) -> dict[str, Any]:
    """cls's fields, each with its Section type (None: a value)."""
    if cls not in _SECTIONS:
        hints = {name: _unless_none(hint) for name, hint in typing.get_type_hints(cls).items()}
        _SECTIONS[cls] = {f.name: hints[f.name] if isinstance(hints[f.name], type) and issubclass(hints[f.name], Section)
                          else None for f in fields(cls)}
    return _SECTIONS[cls]


def _unless_none(hint: Any) -> Any:
    """`X` of an optional section `X | None` (a section a config may leave out, e.g. cluster)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 and len(typing.get_args(hint)) == 2 else hint


def refuse(setting: str, problem: str, accepted: str) -> NoReturn:
    raise InvalidConfig(setting, problem, accepted)


def at_least(value: Any, minimum: int, setting: str, accepted: str | None = None) -> None:
    """An integer >= minimum."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        refuse(setting, f"got {value!r}", accepted or f"an integer >= {minimum}")


def positive_number(value: Any, setting: str, accepted: str) -> None:
    """A number > 0, or null."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        shown = int(value) if isinstance(value, float) and value.is_integer() else value  # the schema made 0 0.0
        refuse(setting, f"got {shown!r}", accepted)
