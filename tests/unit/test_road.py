"""The road from the command to the step is as docs/architecture.md draws it: at most five stages, each
calling the next, the last calling the step. Read from the source (ast), so nothing is imported or run."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import REPO

DOC = REPO / "docs" / "architecture.md"
STAGE_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`(dpo_sweeps(?:\.\w+)+)`\s*\|")
THE_STEP = re.compile(r"^The step is `(dpo_sweeps(?:\.\w+)+)`")
MAX_STAGES = 5


@dataclass(frozen=True)
class Stage:
    dotted: str  # dpo_sweeps.task.run, dpo_sweeps.train.trainer.Trainer.fit
    module: str  # dpo_sweeps.task
    path: Path
    qualname: str  # run, Trainer.fit

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]


def locate(dotted: str) -> Stage:
    """The longest prefix of `dotted` that is a module of the package, and the function's name inside it."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        path = REPO.joinpath(*parts[:cut]).with_suffix(".py")
        if path.is_file():
            return Stage(dotted, ".".join(parts[:cut]), path, ".".join(parts[cut:]))
    raise AssertionError(f"{dotted}: no module of the package holds it")


def documented_road() -> tuple[list[Stage], Stage]:
    lines = DOC.read_text().splitlines()
    rows = [m for m in map(STAGE_ROW.match, lines) if m]
    assert [int(m.group(1)) for m in rows] == list(range(1, len(rows) + 1)), "the stages are numbered 1, 2, ..."
    steps = [m.group(1) for m in map(THE_STEP.match, lines) if m]
    assert len(steps) == 1, f"{DOC.name} names the step once ('The step is `...`')"
    return [locate(m.group(2)) for m in rows], locate(steps[0])


def function_def(stage: Stage) -> tuple[ast.Module, ast.FunctionDef]:
    tree = ast.parse(stage.path.read_text(), str(stage.path))
    scope: ast.AST = tree
    for part in stage.qualname.split("."):
        found = [n for n in ast.iter_child_nodes(scope)
                 if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part]
        assert found, f"{stage.dotted}: {stage.path.relative_to(REPO)} defines no {stage.qualname}"
        scope = found[0]
    assert isinstance(scope, ast.FunctionDef), f"{stage.dotted} is not a function"
    return tree, scope


def called_names(function: ast.FunctionDef) -> set[str]:
    """The names a function calls: `name(...)` and `anything.name(...)`."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                names.add(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                names.add(node.func.attr)
    return names


def wrappers(tree: ast.Module) -> dict[str, str]:
    """Module-level `wrapped = decorator(...)(function)`: the wrapped name, and the function it calls
    (__main__'s `hydra_main`, Hydra's main around the task function)."""
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and len(node.value.args) == 1
                and isinstance(node.value.args[0], ast.Name)):
            found[node.targets[0].id] = node.value.args[0].id
    return found


def imported_from(tree: ast.Module, name: str) -> str | None:
    """The module `name` is imported from anywhere in the file (a lazy import inside a function included)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return node.module
    return None


def test_the_road_has_at_most_five_stages():
    stages, _ = documented_road()
    assert 2 <= len(stages) <= MAX_STAGES, [s.dotted for s in stages]
    assert stages[0].dotted == "dpo_sweeps.__main__.main", "the road starts at the command"


@pytest.mark.parametrize("position", range(MAX_STAGES))
def test_each_stage_calls_the_next_as_the_doc_draws_it(position):
    stages, step = documented_road()
    road = [*stages, step]
    if position >= len(stages):
        pytest.skip(f"the road has {len(stages)} stages")
    stage, following = road[position], road[position + 1]
    tree, function = function_def(stage)
    function_def(following)
    calls = called_names(function)
    through = {wrapper for wrapper, wrapped in wrappers(tree).items() if wrapped == following.name}
    assert following.name in calls or calls & through, (
        f"{stage.dotted} no longer calls {following.dotted}: update the road in {DOC.relative_to(REPO)}")
    source = imported_from(tree, following.name)
    assert source in (None, following.module), (
        f"{stage.dotted} calls a {following.name} imported from {source}, not {following.module}")


def test_the_task_function_imports_no_training_stack_at_module_level():
    """submitit pickles stage 2 by reference, and --help and --cfg import it: its module imports the app
    (and with it the training stack) only inside the function."""
    stages, _ = documented_road()
    task = next(s for s in stages if s.module == "dpo_sweeps.task")
    tree = ast.parse(task.path.read_text())
    top = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    top |= {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    heavy = {m for m in top if m.split(".")[0] in {"torch", "transformers"} or m.startswith("dpo_sweeps.app")
             or m.startswith("dpo_sweeps.train")}
    assert not heavy, heavy
