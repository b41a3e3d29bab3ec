"""What a process of the command sets up before it computes: oneDNN's primitive cache bounded
(dpo_sweeps/runtime/startup.py) in the command, the ranks it starts and any process that trains, the
user's own value kept, and a program that merely imports the package left as it was."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import REPO, cli_env

from dpo_sweeps.runtime.startup import ONEDNN_CACHE_CAPACITY, ONEDNN_CACHE_ENV

PRINT_IT = f"import os; print(os.environ.get({ONEDNN_CACHE_ENV!r}))"


def _env(value: str | None) -> dict[str, str]:
    env = cli_env()
    env.pop(ONEDNN_CACHE_ENV, None)
    if value is not None:
        env[ONEDNN_CACHE_ENV] = value
    return env


def _printed(args: list[str], value: str | None) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=_env(value), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(("users", "expected"), [(None, str(ONEDNN_CACHE_CAPACITY)), ("0", "0")])
def test_a_process_that_trains_bounds_the_cache_unless_the_user_set_it(users, expected):
    code = f"from dpo_sweeps.train.entry import training_rank; training_rank(); {PRINT_IT}"
    assert _printed(["-c", code], users) == expected


@pytest.mark.parametrize(("users", "expected"), [(None, str(ONEDNN_CACHE_CAPACITY)), ("7", "7")])
def test_the_ranks_a_command_starts_inherit_it(users, expected):
    # The package's own torchrun starts one rank, a plain Python that reports its environment.
    args = ["-m", "dpo_sweeps.runtime.torchrun_launch", "--nproc_per_node=1", "--no-python", sys.executable, "-c",
            PRINT_IT]
    assert _printed(args, users) == expected


def test_importing_the_package_changes_no_environment():
    assert _printed(["-c", f"import dpo_sweeps; {PRINT_IT}"], None) == "None"
