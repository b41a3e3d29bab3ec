"""Every dpo-sweeps command the docs show composes: a documented override that no longer exists fails here.

The commands are read from the shell code blocks (```bash, ```sh, ```console, ``` with no language) of
README.md and docs/**/*.md, and the override lists of `api.compose([...])` and `api.train([...])` calls in
their ```python blocks. A line may chain commands (`&&`, `||`, `;`, `|`) and end in a `# comment`; each
command of the chain is judged on its own. What is checked, and the only things skipped:
- checked: a command whose program is `python`/`python3` with `-m dpo_sweeps`, `dpo-sweeps`, or
  `torchrun`/`dpo-sweeps-torchrun` running `-m dpo_sweeps` (leading `NAME=value` environment settings and a
  `$ ` prompt are stripped first);
- skipped: any other command (`pip install ...`, `python analysis/report.py ...`, `bash ...`, `mkdocs ...`);
- skipped: a documented refusal, that is a `$ ` command whose next line in its block starts with `error:` (the
  page shows it being refused; tests/integration test the refusals themselves).
A run composes as `python -m dpo_sweeps` composes it (dpo_sweeps.api.compose); a sweep (`-m`) composes its
master config as Hydra's multirun does, then every point its sweeper would run, each with the sweeper's own
composition (launchers/jobs.py compose_job): the grid's points (with `hydra.sweeper.stages`, every plan with
every algorithm setting), or for `hydra/sweeper=optuna` the points its search space gives (launchers/optuna_space.py).
Composing reads no data and no model, so a command that needs a file this machine lacks still composes.

Every shell, Python, text and JSON block also carries a marker saying whether tests/integration/test_docs_run.py
runs it (and compares its example output) or why not (tests/support/doc_blocks.py); a block without one fails here.
"""

from __future__ import annotations

import ast
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO
from support.doc_blocks import CODE, DOC_FILES, EXAMPLES, Marker, all_blocks, example_mismatch, parse_marker

SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^(```|~~~)\s*([\w+-]*)")
SEPARATORS = {"&&", "||", ";", "|"}
ENV_SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# More sweep points than this are composed as the first ones only (a documented grid is far smaller).
MAX_POINTS = 200


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    multirun: bool
    overrides: tuple[str, ...]


def shell_lines(path: Path) -> list[tuple[int, str, str]]:
    """(line number, line, the next line) of every line inside a shell code block, continuations joined."""
    lines, out, block = path.read_text().splitlines(), [], None
    joined: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line.strip())
        if fence:
            block = None if block is not None else fence.group(2)
            continue
        if block is None or block not in SHELL_BLOCKS:
            continue
        if joined and joined[-1][1].endswith("\\"):
            joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
        else:
            joined.append((number, line.strip()))
    for i, (number, line) in enumerate(joined):
        following = joined[i + 1][1] if i + 1 < len(joined) else ""
        out.append((number, line, following))
    return out


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block, dedented (a block inside a list item is indented)."""
    blocks, block, start, code = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = FENCE.match(line.strip())
        if fence and block is None:
            block, start, code = fence.group(2), number + 1, []
        elif fence:
            if block == "python":
                blocks.append((start, textwrap.dedent("\n".join(code))))
            block = None
        elif block is not None:
            code.append(line)
    return blocks


def api_overrides(path: Path) -> list[tuple[int, list[str]]]:
    """The override lists a ```python block passes to `api.compose([...])` or `api.train([...])`."""
    found = []
    for start, code in python_blocks(path):
        for node in ast.walk(ast.parse(code)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("compose", "train")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "api"
                    and node.args and isinstance(node.args[0], ast.List)):
                found.append((start + node.lineno - 1, [ast.literal_eval(e) for e in node.args[0].elts]))
    return found


def dpo_sweeps_arguments(tokens: list[str]) -> list[str] | None:
    """The arguments a command gives dpo-sweeps, or None when the command is not dpo-sweeps."""
    while tokens and ENV_SETTING.match(tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return None
    program = Path(tokens[0]).name
    if program == "dpo-sweeps":
        return tokens[1:]
    if re.fullmatch(r"python(3(\.\d+)?)?|torchrun|dpo-sweeps-torchrun", program):
        for i, token in enumerate(tokens[1:-1], 1):
            if token == "-m":
                return tokens[i + 2:] if tokens[i + 1] == "dpo_sweeps" else None
    return None


def documented_commands() -> tuple[list[DocCommand], int]:
    """Every dpo-sweeps command of the docs, and how many documented refusals were skipped."""
    commands, refusals = [], 0
    for path in DOC_FILES:
        for number, line, following in shell_lines(path):
            if line.startswith("$ ") and following.startswith("error:"):
                refusals += 1
                continue
            tokens = shlex.split(line.removeprefix("$ "), comments=True)
            chain: list[list[str]] = [[]]
            for token in tokens:
                chain.append([]) if token in SEPARATORS else chain[-1].append(token)
            for part in chain:
                arguments = dpo_sweeps_arguments(part)
                if arguments is None:
                    continue
                multirun = any(a in ("-m", "--multirun") for a in arguments)
                where = f"{path.relative_to(REPO)}:{number}"
                options = [a for a in arguments if a.startswith("-") and a not in ("-m", "--multirun")]
                assert not options, f"{where}: options the docs' check does not know: {options}"
                overrides = tuple(a for a in arguments if a not in ("-m", "--multirun"))
                commands.append(DocCommand(where, multirun, overrides))
        for number, overrides in api_overrides(path):
            commands.append(DocCommand(f"{path.relative_to(REPO)}:{number}", False, tuple(overrides)))
    return commands, refusals


COMMANDS, REFUSALS = documented_commands()


def test_the_docs_show_the_commands_a_newcomer_runs():
    """The check has something to check: the README's quickstart sweep, runs and sweeps from every page."""
    assert any(c.multirun and c.overrides == ("+sweep=quickstart",) and c.where.startswith("README.md")
               for c in COMMANDS)
    pages = {c.where.split(":")[0] for c in COMMANDS}
    assert {"README.md", "docs/runs.md", "docs/sweeps.md", "docs/optuna.md", "docs/losses.md"} <= pages, pages
    assert sum(c.multirun for c in COMMANDS) >= 10 and sum(not c.multirun for c in COMMANDS) >= 10
    assert REFUSALS >= 3  # the refusals runs.md shows
    assert ("loss=ipo", "train.max_steps=20") in {c.overrides for c in COMMANDS if c.where.startswith("docs/api.md")}


def sweep_points(master, overrides: list[str]) -> list[list[str]]:
    """The points the sweep's sweeper would run (their overrides), as it derives them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    sweeper = master.hydra.sweeper
    arguments = list(OmegaConf.to_container(master.hydra.overrides.task))
    if str(sweeper._target_).endswith("OptunaSweeper"):
        from dpo_sweeps.launchers.optuna_space import SearchSpace

        params = OmegaConf.to_container(sweeper.params, resolve=False) if sweeper.get("params") else {}
        space = SearchSpace.parse(params, arguments, sweeper.get("custom_search_space"))
        return space.points(master)
    params = dict(OmegaConf.to_container(sweeper.params, resolve=False) or {}) if sweeper.get("params") else {}
    stages = sweeper.get("stages")
    if stages:  # a staged search trains every algorithm setting on the plans it picks: every pair composes
        params.update(OmegaConf.to_container(stages.systems))
        params.update(OmegaConf.to_container(stages.algorithm))
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + arguments)
    return [point for batch in BasicSweeper.split_arguments(parsed, None) for point in batch]


def compose_sweep(overrides: list[str]) -> int:
    """Compose a sweep's master config and every point; returns how many points composed."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import setup_globals
    from hydra.types import HydraContext, RunMode

    from dpo_sweeps.config import config_dir
    from dpo_sweeps.launchers.jobs import compose_job
    from dpo_sweeps.runtime.launch_time import register_resolver

    setup_globals()
    register_resolver()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(config_dir()))
    master = loader.load_configuration("config", overrides, RunMode.MULTIRUN)
    before = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(master)  # as Hydra's multirun does before the sweeper runs
    try:
        points = sweep_points(master, overrides)
        assert points, "the sweep has no point"
        context = HydraContext(config_loader=loader, callbacks=None)
        for num, point in enumerate(points[:MAX_POINTS]):
            compose_job(context, master, point, num)
    finally:
        HydraConfig.instance().cfg = before
    return len(points)


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{c.where}" for c in COMMANDS])
def test_documented_command_composes(command):
    if command.multirun:
        compose_sweep(list(command.overrides))
    else:
        from dpo_sweeps import api

        api.compose(list(command.overrides))


def test_a_removed_override_is_caught():
    """The check fails for a setting that does not exist, in a run and in a sweep's point."""
    from dpo_sweeps import api
    from dpo_sweeps.errors import RunFailure
    from dpo_sweeps.launchers.jobs import JobCompositionError

    with pytest.raises((RunFailure, ValueError), match="train.no_such_key"):
        api.compose(["train.no_such_key=1"])
    with pytest.raises(JobCompositionError, match="no_such_key"):
        compose_sweep(["+sweep=quickstart", "train.no_such_key=1,2"])


def test_readme_links_point_at_files_that_exist():
    """The README is read on GitHub, outside the site's --strict build: its relative links are checked here."""
    readme = (REPO / "README.md").read_text()
    targets = {m.group(1).split("#")[0] for m in re.finditer(r"\]\(([^)\s]+)\)", readme)
               if not re.match(r"[a-z]+:", m.group(1))}
    missing = sorted(t for t in targets if t and not (REPO / t).exists())
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_ci_runs_the_readme_test_command():
    """.ci/run mirrors the README's second command, step by step (quietly: `pip install -q`), then builds the site."""
    readme = (REPO / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("python3 -m venv") and "pytest" in line)
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    for step in (s.strip() for s in command.split("&&")):
        assert step.replace("pip install ", "pip install -q ") in ci, step
    assert "mkdocs build --strict" in ci


# Every block of the docs is run by tests/integration/test_docs_run.py or says why not (tests/support/doc_blocks.py).
BLOCKS = all_blocks()
MARKED = [b for b in BLOCKS if b.lang in CODE | EXAMPLES]


@pytest.mark.parametrize("block", MARKED, ids=[b.where for b in MARKED])
def test_every_block_is_run_or_says_why_not(block):
    assert block.marker_error is None, f"{block.where}: {block.marker_error}"
    assert block.marker is not None, (
        f"{block.where}: a ```{block.lang} block with no marker on the line before it: <!-- run -->, "
        "<!-- run: DPO_SWEEPS_SMOKE=1 --> (tests/integration/test_docs_run.py runs it as written), "
        "<!-- output of the command above --> (an example it compares) or <!-- not run: why -->")
    kind = block.marker.kind
    if kind == "run":
        assert block.lang in CODE, f"{block.where}: only shell and Python blocks run, not ```{block.lang}"
        page = (REPO / block.page).read_text()
        visible = re.sub(r"<!--.*?-->", "", page, flags=re.S)
        for name, value in block.marker.env.items():
            assert f"{name}={value}" in visible, (
                f"{block.where}: the run sets {name}={value}, which the page does not mention: a reader's run "
                "would differ from the test's")
    if kind == "output of the command above":
        page = [b for b in BLOCKS if b.page == block.page]
        before = page[page.index(block) - 1] if page.index(block) else None
        assert block.lang in EXAMPLES, f"{block.where}: an output is a ```text block"
        assert before is not None and before.marker is not None and before.marker.kind == "run", (
            f"{block.where}: an output must follow the block that prints it, marked <!-- run -->")


def test_the_docs_run_what_a_newcomer_runs_first():
    """The README's first command and its dry run on H100 are run; nothing is left unmarked for lack of blocks."""
    run = {b.where: b for b in MARKED if b.marker and b.marker.kind == "run"}
    first = next(b for b in BLOCKS if b.page == "README.md" and "+sweep=quickstart" in b.code)
    assert first.where in run and run[first.where].marker.env == {"DPO_SWEEPS_SMOKE": "1"}
    assert any("cluster=h100_sxm" in b.code for b in run.values() if b.page == "README.md")
    assert len(run) >= 8 and len(MARKED) >= 50


def test_parse_marker_refuses_what_it_cannot_read():
    assert parse_marker("<!-- run: DPO_SWEEPS_SMOKE=1; the install is the test's -->") == Marker(
        "run", {"DPO_SWEEPS_SMOKE": "1"}, "the install is the test's")
    assert "needs its reason" in parse_marker("<!-- not run -->")
    assert "NAME=VALUE" in parse_marker("<!-- run: smoke -->")
    assert "not a marker" in parse_marker("<!-- runs -->")


REAL = """dry run: 2 of 2 jobs would be launched into multirun/2026-12-07/09-33-07 (none was started)
  #0  fsdp=full_shard   [8 ranks -> multirun/2026-12-07/09-33-07/0]
        predicted: step 0.0209 [0.015-0.0292] s expected (worst case 0.278 s), peak 31.41 GiB; fits 80 GiB
  #1  fsdp=shard_grad_op   [8 ranks -> multirun/2026-12-07/09-33-07/1]
        predicted: step 0.0159 [0.0122-0.0209] s expected (worst case 0.278 s), peak 33.00 GiB; fits 80 GiB
predicted total: 0.00983 device-hours [0.00724-0.0134] for 2 runs
"""


def test_an_example_matches_its_output_up_to_what_it_leaves_open():
    shape = ["  #0  fsdp=full_shard [8 ranks -> multirun/.../0]",
             "        predicted: step S [LOW-HIGH] s expected (worst case W s), peak ... GiB; fits 80 GiB",
             "  ...",
             "predicted total: T device-hours [LOW-HIGH] for 2 runs"]
    assert example_mismatch(shape, REAL) is None
    assert example_mismatch(REAL.splitlines(), REAL, whole=True) is None


@pytest.mark.parametrize("stale", [
    "predicted: step 0.133 [0.015-0.0292] s expected (worst case 0.278 s), peak 31.41 GiB; fits 80 GiB",  # a figure
    "predicted: step S [LOW-HIGH] s (worst case W s), peak ... GiB; fits 80 GiB",  # the wording
    "predicted: step S [LOW-HIGH] s expected, peak ... GiB; fits 80 GiB",  # a field less
])
def test_a_stale_example_does_not_match(stale):
    assert "no output line is like" in example_mismatch([stale], REAL)


def test_a_command_example_shows_all_its_output_in_order():
    lines = REAL.splitlines()
    assert "not in the example's order" in example_mismatch([lines[2], lines[1]], REAL)
    assert example_mismatch(lines[1:], REAL, whole=True) is not None  # a line the page leaves out
    assert example_mismatch(lines[:2], REAL) is None  # a passage, where the page shows one
