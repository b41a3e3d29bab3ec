"""The docs' commands run as written, and the outputs the pages show are the outputs they print.

Every block marked `<!-- run ... -->` in README.md and docs/*.md (tests/support/doc_blocks.py) runs here, page
by page in the site's order, all in one working directory, as a reader following the pages would: the README's
quickstart sweep is there when docs/cost.md prices it. The directory links the repository's files (analysis/,
bench/, conf/, ...) and `../shared`, so the pages' relative paths work, and nothing lands in the checkout.
A run marker's environment settings (`DPO_SWEEPS_SMOKE=1`, which the page mentions) are the only thing added.
The steps that install (`python3 -m venv`, `. .venv/bin/activate`, `pip install`) are left out of a chain:
the test environment is that install, and .ci/run runs those steps (tests/unit/test_docs_commands.py
test_ci_runs_the_readme_test_command).

Compared with what the command prints (doc_blocks.example_mismatch): each `$ command` line's following lines
(all of its output, line for line) and a ```text block marked `<!-- output of the command above -->` (a
passage of its output). A changed wording, a line more or less, or a different number fails; the `...` of
an example and capitals standing for figures (S, LOW-HIGH) match anything, and the working directory's path
is cut from the output, as the pages write run directories relative to where the command ran.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support.doc_blocks import SHELL, all_blocks, example_mismatch, shell_commands

pytestmark = pytest.mark.slow

BLOCKS = all_blocks()
RUN = [b for b in BLOCKS if b.marker is not None and b.marker.kind == "run"]
INSTALL = re.compile(r"^(python3? -m venv |\. \S*activate$|source \S*activate$|pip3? install )")


def examples_after(block):
    """The ```text block marked as this run block's output, if the page has one right after it."""
    page = [b for b in BLOCKS if b.page == block.page]
    following = page[page.index(block) + 1:page.index(block) + 2]
    return [b for b in following if b.marker is not None and b.marker.kind == "output of the command above"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A reader's working directory: the repository's files linked in, `../shared` beside it."""
    base = tmp_path_factory.mktemp("reader")
    (base / "shared").symlink_to(REPO.parent / "shared")
    work = base / "repo"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in {"outputs", "multirun", ".git", ".venv", "site", "wandb", ".pytest_cache"}:
            (work / entry.name).symlink_to(entry)
    return work


def run_line(command: str, workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """One line of a block, through bash as a reader's shell would; the installing steps of a chain left out."""
    steps = [s for s in command.split(" && ") if not INSTALL.match(s.strip())]
    if not steps:
        return subprocess.CompletedProcess(command, 0, "", "")
    return subprocess.run(["bash", "-o", "pipefail", "-c", " && ".join(steps)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=900)


def shown(result: subprocess.CompletedProcess, workdir: Path) -> str:
    """What the command printed (stdout, then stderr), with the working directory's path cut out."""
    text = result.stdout + "\n" + result.stderr
    return text.replace(f"{workdir}/", "").replace(str(workdir), ".")


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_documented_block_runs_as_written(block, workdir):
    env = {**os.environ, **block.marker.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if block.lang == "python":
        command = "the block"
        result = subprocess.run([sys.executable, "-c", block.code], cwd=workdir, env=env, capture_output=True,
                                text=True, timeout=900)
        assert result.returncode == 0, f"{block.where}: the block failed\n{result.stderr[-3000:]}"
    else:
        assert block.lang in SHELL
        for command, example in shell_commands(block.code):
            result = run_line(command, workdir, env)
            output = shown(result, workdir)
            if example:  # a `$ command` with its output: all of it, line for line
                refused = example[0].startswith("error:")
                assert (result.returncode != 0) == refused, f"{block.where}: `{command}` exited {result.returncode}\n{output[-3000:]}"
                problem = example_mismatch(example, output, whole=True)
                assert problem is None, f"{block.where}: `{command}` printed other than the page shows: {problem}"
            else:
                assert result.returncode == 0, f"{block.where}: `{command}` exited {result.returncode}\n{output[-3000:]}"
    for shows in examples_after(block):
        problem = example_mismatch(shows.code.splitlines(), shown(result, workdir))
        assert problem is None, f"{shows.where}: the example is not what `{command}` printed: {problem}"


def test_the_readme_quickstart_trained_its_eight_points_on_two_bound_ranks(workdir):
    """What README command 1 left in the reader's directory (it ran above, under DPO_SWEEPS_SMOKE=1): 8 distinct
    points, each completed on 2 ranks, each rank on its own core (resources.bind_cores), and the report."""
    sweep = workdir / "multirun" / "quickstart"
    assert sweep.exists(), "README command 1 runs first: test_documented_block_runs_as_written[README.md:23]"
    summaries = [json.loads((sweep / str(n) / "summary.json").read_text()) for n in range(8)]
    assert all(s["status"] == "completed" and s["metrics"]["world_size"] == 2 for s in summaries)
    points = {(s["config"]["fsdp"]["sharding_strategy"], s["config"]["precision"]["name"], s["config"]["loss"]["beta"])
              for s in summaries}
    assert len(points) == 8
    logs = "".join(p.read_text() for p in sweep.glob("*/*.log"))
    assert len(re.findall(r"rank 0 bound to cores \[\d+\] by the launcher", logs)) == 8, logs[-2000:]
    assert (sweep / "report" / "report.html").exists()
