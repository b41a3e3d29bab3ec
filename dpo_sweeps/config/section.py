"""What every section of the config is (schema.py, data_schema.py, dpo/losses/schema.py): a dataclass
Hydra composes into, frozen once built, built from a resolved config by `of`, and checking its own
fields in `check`, each refusal one InvalidConfig line naming the setting and what is accepted: a field
made with `setting(...)` (setting.py) is checked from its metadata, the rules between fields are the
section's own `check`."""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from dataclasses import Field, FrozenInstanceError, fields
from typing import Any, ClassVar

# refuse, at_least, positive_number: the helpers every section's check uses, re-exported.
from dpo_sweeps.config.setting import CHOICES, at_least, positive_number, refuse, setting_of

__all__ = ["Section", "at_least", "choice_fields", "positive_number", "refuse", "section_types", "setting_fields"]


class Section:
    """A section of the config. Hydra builds it while composing (its fields MISSING until conf/ sets
    them); `of` builds it from a resolved config. Either way it is frozen once built: a resolved config
    does not change (a probe derives its own with dataclasses.replace, train/probe.py). Not
    @dataclass(frozen=True): OmegaConf makes a frozen dataclass's node read-only, and composing merges
    conf/'s values into that node (ReadonlyConfigError)."""

    _frozen = False  # set on the instance once built (a class default: no lookup miss per field set)
    at: ClassVar[str] = ""  # where the section sits in the config ("train", "train.reference_sync")

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
        """Refuse the first field whose value this section does not accept (InvalidConfig, one line): here,
        each `setting` field against its accepted values; a section adds the rules between its fields."""
        for f in fields(self):
            spec = setting_of(f)
            if spec is not None and spec.accepted_values is not None:
                spec.accepted_values.check(getattr(self, f.name), f"{self.at}.{f.name}")


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


def setting_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, type, Field]]:
    """Every field of `cls` that is a value, not a section, as (dotted key, its section's class, the field),
    walking the sections inside it. A key of a section typed per choice (`data`, `loss`) comes once, as the
    first choice that has it declares it (its read_when and default are every choice's; a loss's accepted
    range may differ: `choice_fields`)."""
    seen = set()
    for key, _, owner, f in choice_fields(cls, prefix):
        if key not in seen:
            seen.add(key)
            yield key, owner, f


def choice_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, str | None, type, Field]]:
    """Every value field of `cls` as (dotted key, the choice whose schema has it or None, its class, the
    field): a key of a section typed per choice once per choice that has it."""
    for key, owner, f in _fields(cls, prefix):
        schemas = f.metadata.get(CHOICES)
        if schemas is None:
            yield key, None, owner, f
            continue
        for choice, schema in schemas.items():
            for inner_key, inner_owner, inner in _fields(schema, f"{key}."):
                yield inner_key, choice, inner_owner, inner


def _fields(cls: type, prefix: str) -> Iterator[tuple[str, type, Field]]:
    for f in fields(cls):
        inner = section_types(cls)[f.name]
        if inner is not None:
            yield from _fields(inner, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", cls, f
