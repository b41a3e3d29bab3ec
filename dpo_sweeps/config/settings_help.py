"""The settings listing of `python -m dpo_sweeps --help`, generated from the schema: every key (those of every
data source and every loss too), its type and default, what it accepts, when it is read (its `setting`,
config/setting.py) and the docstring under its field (a loss's keys are documented in their conf/loss file). conf/config.yaml's `hydra.help.template` asks for it as `${dpo_sweeps_settings:}`."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import typing
from functools import cache

from omegaconf import MISSING, OmegaConf

from dpo_sweeps.config.section import choice_fields, setting_fields
from dpo_sweeps.config.setting import setting_of

RESOLVER = "dpo_sweeps_settings"


@cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: the docstring under it, cleaned as inspect.cleandoc cleans} for `cls` and the dataclasses it
    inherits from (Python keeps no docstring for a field: they are read from the source). The --help listing
    and the config reference page (docs/hooks/config_reference.py) both read them here."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # built-ins, classes made at run time
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:] + [None], strict=True):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _default(field: dataclasses.Field) -> str:
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
        return "required"
    value = field.default_factory() if field.default is dataclasses.MISSING else field.default
    if value == MISSING:
        return "set by conf/"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _type(cls: type, field: dataclasses.Field) -> str:
    hint = typing.get_type_hints(cls).get(field.name, field.type)
    text = str(hint) if typing.get_origin(hint) else getattr(hint, "__name__", str(hint))
    text = re.sub(r"\b(?:[a-z_]\w*\.)+(?=[A-Za-z_]\w*)", "", text)  # typing.Any, dpo_sweeps...MixTerm: the name
    return re.sub(r"Optional\[(.+)\]", r"\1 | None", text.replace("NoneType", "None"))


def _choices(config_type: type) -> dict[str, tuple[list[str], dict[str | None, list[str]]]]:
    """{key of a section typed per choice: (the choices whose schema has it, {what it accepts: the choices
    that accept that})}: a key not every choice has says which have it, and a loss whose range of a shared
    key is its own says so (exo_pair's label_smoothing)."""
    found: dict[str, tuple[list[str], dict[str | None, list[str]]]] = {}
    every: dict[str, set[str]] = {}
    for key, choice, _, field in choice_fields(config_type):
        if choice is None:
            continue
        spec = setting_of(field)
        have, accepted = found.setdefault(key, ([], {}))
        have.append(choice)
        accepted.setdefault(spec.accepted if spec is not None else None, []).append(choice)
        every.setdefault(key.split(".", 1)[0], set()).add(choice)
    return {key: (have if set(have) != every[key.split(".", 1)[0]] else [], accepted)
            for key, (have, accepted) in found.items()}


def settings_help(config_type: type) -> str:
    """One entry per setting of `config_type` (the schema's Config): `key: type = default`, then what it
    accepts, when it is read and what it does, indented."""
    entries = []
    per_choice = _choices(config_type)
    for key, cls, field in setting_fields(config_type):
        lines = [f"{key}: {_type(cls, field)} = {_default(field)}"]
        spec = setting_of(field)
        have, variants = per_choice.get(key, ([], {}))
        if have:
            lines.append(f"only in the {key.split('.', 1)[0]} schemas {', '.join(have)}")
        if spec is not None and spec.accepted is not None:
            others = [f"{', '.join(choices)}: {text}" for text, choices in list(variants.items())[1:]]
            lines.append(f"accepted: {spec.accepted}" + "".join(f"; with {other}" for other in others))
        for when in spec.read_when if spec is not None else ():
            lines.append(f"not read, and refused when set, where {when.why} (instead: {when.instead})")
        if doc := field_docs(cls).get(field.name):
            lines.append(" ".join(doc.split()))  # one paragraph, filled below
        entries.append("\n".join([lines[0]] + [textwrap.fill(line, 116, initial_indent="    ",
                                                              subsequent_indent="      ") for line in lines[1:]]))
    return "\n".join(entries)


def register_resolver(config_type: type) -> None:
    """`${dpo_sweeps_settings:}`: the listing, `$` doubled for the string.Template Hydra fills the help with."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, lambda: settings_help(config_type).replace("$", "$$"))
