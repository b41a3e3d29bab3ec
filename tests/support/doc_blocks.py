"""The code blocks of README.md and docs/*.md, with the marker that says whether a test runs each one.

A marker is an HTML comment on the line before a block's opening fence (blank lines and the snippet
markers `<!-- --8<-- ... -->` may sit between); the site and GitHub render it as nothing:

- `<!-- run -->`, or `<!-- run: DPO_SWEEPS_SMOKE=1 -->` (environment settings the page itself mentions), and
  optionally `; a note` after them: tests/integration/test_docs_run.py runs the block as written. A block of
  `$ command` lines, each followed by its output, is run command by command and each output compared.
- `<!-- output of the command above -->` before a ```text block: the output of the run block above (its last
  command), compared with the block (`example_mismatch`).
- `<!-- not run: why -->`: no test runs it, and the page's source says why.

tests/unit/test_docs_commands.py requires one of them on every shell, Python, text and JSON block.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from support import REPO

DOC_FILES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if "hooks" not in p.parts)]
SHELL = {"", "bash", "sh", "shell", "console"}
CODE = SHELL | {"python"}
EXAMPLES = {"text", "json"}
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
MARKER = re.compile(r"^<!--\s*(run|not run|output of the command above)\s*(?::\s*(.*?))?\s*-->$")
SNIPPET = re.compile(r"^<!--\s*--8<--.*-->$")
ENV_SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")


@dataclass(frozen=True)
class Marker:
    kind: str  # "run", "not run", "output of the command above"
    env: dict[str, str] = field(default_factory=dict)  # a run's environment settings
    note: str = ""  # a run's note, or why a block is not run


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: README.md, docs/runs.md
    line: int  # the opening fence's
    lang: str
    code: str  # dedented (a block inside a list item is indented)
    marker: Marker | None
    marker_error: str | None = None  # a comment that looks like a marker but does not parse

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse_marker(text: str) -> Marker | str:
    """The marker a comment line holds, or why it is not one."""
    match = MARKER.match(text)
    if not match:
        return f"not a marker: {text!r} (accepted: <!-- run -->, <!-- run: NAME=VALUE; note -->, <!-- not run: why -->, " \
               "<!-- output of the command above -->)"
    kind, rest = match.group(1), match.group(2) or ""
    if kind == "not run":
        return Marker(kind, note=rest) if rest else "<!-- not run: ... --> needs its reason after the colon"
    if kind == "output of the command above":
        return Marker(kind) if not rest else f"<!-- output of the command above --> takes nothing more: {rest!r}"
    settings, _, note = rest.partition(";")
    env = {}
    for setting in settings.split():
        if not ENV_SETTING.match(setting):
            return f"<!-- run: ... --> takes NAME=VALUE settings before its `;`: got {setting!r}"
        name, _, value = setting.partition("=")
        env[name] = value
    return Marker(kind, env, note.strip())


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a page, in order, each with the marker before it."""
    lines = path.read_text().splitlines()
    found, opened, start, code = [], None, 0, []
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line)
        if fence and opened is None:
            opened, start, code = fence.group(2), number, []
        elif fence:
            marker, error = _marker_before(lines, start - 1)
            found.append(Block(str(path.relative_to(REPO)), start, opened, textwrap.dedent("\n".join(code)),
                               marker, error))
            opened = None
        elif opened is not None:
            code.append(line)
    return found


def _marker_before(lines: list[str], index: int) -> tuple[Marker | None, str | None]:
    """The marker on the lines before lines[index] (0-based), skipping blank lines and snippet markers."""
    for line in reversed(lines[:index]):
        text = line.strip()
        if not text or SNIPPET.match(text):
            continue
        if not text.startswith("<!--"):
            return None, None
        marker = parse_marker(text)
        return (marker, None) if isinstance(marker, Marker) else (None, marker)
    return None, None


def all_blocks() -> list[Block]:
    return [block for path in DOC_FILES for block in blocks(path)]


def shell_commands(code: str) -> list[tuple[str, list[str]]]:
    """A shell block's commands, continuation lines joined, each with the output lines that follow it: for a
    block of `$ command` lines, the lines up to the next `$ `; for a block of bare commands, none."""
    joined: list[str] = []
    for line in code.splitlines():
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1].rstrip() + " " + line.strip()
        elif line.strip():
            joined.append(line.strip())
    if not any(line.startswith("$ ") for line in joined):
        return [(line, []) for line in joined if not line.startswith("#")]
    commands: list[tuple[str, list[str]]] = []
    for line in joined:
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands:
            commands[-1][1].append(line)
    return commands


NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?"


def _line_pattern(example: str) -> re.Pattern:
    """An example line as a pattern: `...` (and `..`) stand for any text, a word in capitals (S, LOW, T) for a
    number or itself, a run of spaces for any run of spaces (alignment); everything else is literal."""
    parts = re.split(r"(\.{2,}|\b[A-Z]{1,4}\b|\s+)", example.strip())
    pattern = []
    for part in parts:
        if re.fullmatch(r"\.{2,}", part):
            pattern.append(".*?")
        elif re.fullmatch(r"[A-Z]{1,4}", part):
            pattern.append(f"(?:{part}|{NUMBER})")
        elif part.isspace():
            pattern.append(r"\s+")
        else:
            pattern.append(re.escape(part))
    return re.compile("".join(pattern))


def example_mismatch(example: list[str], output: str, whole: bool = False) -> str | None:
    """None when the example lines show the output: consecutive output lines, a line of just `...` standing for
    any number of lines; with `whole`, all of the output's non-blank lines. Otherwise what differs."""
    got = [line.strip() for line in output.splitlines() if line.strip()]
    wanted = [line for line in example if line.strip()]

    def matches(i: int, j: int) -> bool:  # wanted[i:] against got[j:]
        if i == len(wanted):
            return not whole or j == len(got)
        if wanted[i].strip() == "...":
            return any(matches(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and bool(_line_pattern(wanted[i]).fullmatch(got[j])) and matches(i + 1, j + 1)

    starts = [0] if whole else range(len(got) + 1)
    if any(matches(0, j) for j in starts):
        return None
    # The first example line no output line matches says what changed.
    for line in wanted:
        if line.strip() != "..." and not any(_line_pattern(line).fullmatch(g) for g in got):
            return f"no output line is like the example's\n    {line.strip()}\nthe output:\n" + "\n".join(got)
    return "the output's lines are not in the example's order\nthe output:\n" + "\n".join(got)
