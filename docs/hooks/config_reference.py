"""MkDocs hook: the config reference page (`reference/config.md`), generated from the typed schema.

The schema is the documentation (dpo_sweeps/config/schema.py: a dataclass per section, a docstring under
every field), so this page is rendered from it at build time rather than written a second time. It walks
`Config`'s fields: a section typed by a dataclass is rendered field by field (nested dataclasses, such as
`model.tokenizer`, as their own tables), and a section typed per choice (`data` per source, `loss` per loss)
by every dataclass of its group in the ConfigStore (`schema/<section>/<name>`). A section added to
`Config` appears here with no change to this file. Field docstrings are read from each class's source with
`ast` (the Python runtime keeps no docstring for a field); a field made at run time (the losses', from the
loss registry) shows the accepted values its metadata carries instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Any

PAGE = "reference/config.md"

INTRO = """# Config reference

Every key a run reads, generated from the typed schema when the site is built (`docs/hooks/config_reference.py`
reads `dpo_sweeps/config/schema.py`, `dpo_sweeps/config/data_schema.py`, `dpo_sweeps/dpo/losses/schema.py` and
any section added to `Config`). The text under each key is the docstring under its field. conf/ chooses the
values: a default here is the schema's own; *set by conf/* means the file of the group chosen sets it (`model=`,
`data=`, `loss=`, `fsdp=`, `precision=`). `python -m dpo_sweeps --help` lists the same settings in the terminal.

Change a key on the command line as `section.key=value` (`train.lr=1e-3`); a key the schema does not have, or
a value of the wrong type, is refused while the config is composed, before anything runs.
"""


def _field_docs(cls: type) -> dict[str, str]:
    """{field: the docstring under it}: the --help listing's reading of the schema's source."""
    from dpo_sweeps.config.settings_help import field_docs

    return field_docs(cls)


def _hints(cls: type) -> dict[str, Any]:
    """The fields' types; a field whose annotation its module cannot resolve keeps it as written (a string)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:
        namespace = vars(inspect.getmodule(cls) or typing)
        hints = {}
        for field in dataclasses.fields(cls):
            try:
                hints[field.name] = eval(field.type, namespace) if isinstance(field.type, str) else field.type  # noqa: S307
            except Exception:
                hints[field.name] = field.type
        return hints


def _type_text(cls: type, field: dataclasses.Field) -> str:
    hint = _hints(cls).get(field.name, field.type)
    if isinstance(hint, str):
        return hint
    text = str(hint) if typing.get_origin(hint) else getattr(hint, "__name__", str(hint))
    text = re.sub(r"\b(?:[a-z_]\w*\.)+(?=[A-Za-z_]\w*)", "", text)  # dpo_sweeps.dpo.losses.schema.MixTerm: MixTerm
    return re.sub(r"Optional\[(.+)\]", r"\1 | None", text.replace("NoneType", "None"))


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field holds: its type, or the one inside `X | None` or `list[X]`."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    inner = [a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)]
    return inner[0] if len(inner) == 1 else None


def _default_text(field: dataclasses.Field) -> str:
    from omegaconf import MISSING

    if field.default is not dataclasses.MISSING:
        return "*set by conf/*" if field.default == MISSING else f"`{_yaml(field.default)}`"
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        return "" if dataclasses.is_dataclass(value) else f"`{_yaml(value)}`"
    return ""


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _text(text: str) -> str:
    """A docstring as Markdown: `<conf/model file>` is text, not an HTML tag (code spans are left as they are)."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;").replace(">", "&gt;") for i, part in enumerate(parts))


def _cell(text: str) -> str:
    """One table cell: on one line, its pipes escaped outside code spans (a table ignores those inside)."""
    parts = _text(" ".join(text.split())).split("`")
    return "`".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


@dataclasses.dataclass
class ConfFile:
    """What a conf/ file says of its keys: a group's file documents the keys its schema leaves undocumented
    (a loss's hyperparameters are documented in conf/loss/NAME.yaml, once: dpo/losses/schema.py)."""

    path: str
    header: str  # the comment block the file opens with
    comments: dict[str, str]  # top-level key: the comment lines right above it
    values: dict[str, str]  # top-level key: its value as written

    @classmethod
    def read(cls, path: Path, repo: Path) -> ConfFile:
        lines = path.read_text().splitlines()
        header = []
        for line in lines:
            if not line.startswith("#"):
                break
            header.append(line[1:].removeprefix(" "))
        comments, values, pending = {}, {}, []
        for line in lines[len(header):]:
            key = re.match(r"([A-Za-z_]\w*):\s*(.*)$", line)
            if line.startswith("#"):
                pending.append(line.lstrip("# ").rstrip())
            elif key:
                if pending:
                    comments[key.group(1)] = " ".join(pending)
                values[key.group(1)] = key.group(2).split(" #")[0].strip()
                pending = []
            elif not line.startswith(" "):
                pending = []
        return cls(str(path.relative_to(repo)), "\n".join(header), comments, values)


def _description(cls: type, field: dataclasses.Field, conf: ConfFile | None = None) -> str:
    doc = _field_docs(cls).get(field.name) or (conf.comments.get(field.name, "") if conf else "")
    accepted = next((getattr(v, "accepted", None) for v in field.metadata.values()), None)
    # A field made with `setting(...)` (dpo_sweeps/config/setting.py) also says where it is not read.
    unread = [f"{w.why} (instead: {w.instead})" for v in field.metadata.values() for w in getattr(v, "read_when", ())]
    return " ".join(part for part in (doc, f"Accepted: {accepted}." if accepted else "",
                                      f"Not read, and refused when set, where {'; or where '.join(unread)}." if unread
                                      else "") if part)


def _table(prefix: str, cls: type, conf: ConfFile | None = None) -> tuple[list[str], list[tuple[str, type]]]:
    """The rows of `cls`'s fields, and the nested dataclasses to render after it."""
    lines = ["| key | type | default | what it does |", "| --- | --- | --- | --- |"]
    nested = []
    for field in dataclasses.fields(cls):
        if field.name.startswith("_"):
            continue
        inner = _dataclass_in(_hints(cls).get(field.name))
        if inner is not None:
            is_list = typing.get_origin(_hints(cls)[field.name]) is list
            nested.append((f"{prefix}.{field.name}" + ("[]" if is_list else ""), inner))
        default = _default_text(field)
        if conf and field.name in conf.values and default == "*set by conf/*":
            default = f"`{conf.values[field.name]}` (its conf/ file)" if conf.values[field.name] else default
        lines.append(f"| `{prefix}.{field.name}` | {_cell(f'`{_type_text(cls, field)}`')} | {_cell(default)} | "
                     f"{_cell(_description(cls, field, conf))} |")
    return lines, nested


def _section(prefix: str, cls: type, level: int, title: str | None = None, conf: ConfFile | None = None) -> list[str]:
    lines = [f"{'#' * level} {title or f'`{prefix}`'}", ""]
    doc = inspect.getdoc(cls) if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") else None
    if doc:
        lines += [_text(doc), ""]
    if conf and conf.header:
        lines += [f"`{conf.path}` opens with:", "", "```text", conf.header, "```", ""]
    rows, nested = _table(prefix, cls, conf)
    lines += rows + [""]
    for name, inner in nested:
        lines += _section(name, inner, level + 1)
    return lines


def _conf_file(section: str, schema: str) -> ConfFile | None:
    """conf/<section>/<schema>.yaml, the group's file of the same name as the schema (a loss's), if there is one."""
    from dpo_sweeps.config import config_dir

    conf = Path(config_dir())
    path = conf / section / f"{schema}.yaml"
    return ConfFile.read(path, conf.parent) if path.exists() else None


def _group_schemas(section: str) -> dict[str, type]:
    """The dataclasses stored as `schema/<section>/<name>` in Hydra's ConfigStore (a section typed per choice)."""
    from hydra.core.config_store import ConfigStore

    group = ConfigStore.instance().repo.get("schema", {}).get(section, {})
    schemas = {}
    for file_name, node in sorted(group.items()):
        node_type = getattr(node.node, "_metadata", None) and node.node._metadata.object_type
        if isinstance(node_type, type) and dataclasses.is_dataclass(node_type):
            schemas[file_name.removesuffix(".yaml")] = node_type
    return schemas


def render(root: type | None = None) -> str:
    """The page's Markdown, from the schema as it is imported now (`root`: the config class; default `Config`)."""
    import dpo_sweeps  # noqa: F401  (registers every schema in the ConfigStore)
    from dpo_sweeps.config.schema import Config

    Config = root or Config  # noqa: N806
    hints = _hints(Config)
    lines = [INTRO, "Sections: " + ", ".join(f"[`{f.name}`](#{f.name})" for f in dataclasses.fields(Config)), ""]
    for field in dataclasses.fields(Config):
        hint = _dataclass_in(hints.get(field.name))
        doc = _field_docs(Config).get(field.name)
        if hint is not None:
            lines += [f"## {field.name}", ""] + ([_text(doc), ""] if doc else [])
            rows, nested = _table(field.name, hint)
            class_doc = inspect.getdoc(hint) if hint.__doc__ and not hint.__doc__.startswith(hint.__name__ + "(") else None
            lines += ([_text(class_doc), ""] if class_doc else []) + rows + [""]
            for name, inner in nested:
                lines += _section(name, inner, 3)
            continue
        schemas = _group_schemas(field.name)
        lines += [f"## {field.name}", ""] + ([_text(doc), ""] if doc else [])
        if not schemas:
            lines += [f"`{field.name}` is typed `{_type_text(Config, field)}`.", ""]
        for name, schema in schemas.items():
            conf = _conf_file(field.name, name)
            title = f"`{field.name}={name}`" if conf else f"`{field.name}`: the `{name}` schema"
            lines += _section(field.name, schema, 3, title=title, conf=conf)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ MkDocs events
def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    """`mkdocs serve` rebuilds the page when a schema file changes."""
    import dpo_sweeps

    server.watch(str(Path(dpo_sweeps.__file__).parent / "config"))
    return server
