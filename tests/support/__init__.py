"""Shared test helpers: run the real CLI in a subprocess and read what it wrote.

On the path through pyproject.toml's `pythonpath = ["tests"]`: `from support import run_cli`;
the faults, sweeps, reports, slurm and wandb_records modules beside this one serve those tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HH_PATH = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"

# Short, quiet runs: tests pass these first, then their own overrides (later ones win).
QUIET = ["wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false"]


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    run_dir: Path

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def records(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def train_losses(self) -> list[float]:
        return [r["train/loss"] for r in self.records if "train/loss" in r]


def summary_json(run_dir: Path) -> dict | None:
    """run_dir's summary.json as the file has it (INTERFACE.md), None while there is none (or half of one)."""
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(run_dir: Path, *overrides: str, timeout: float = 300, quiet: bool = True, cwd: Path = REPO) -> RunResult:
    """`python -m dpo_sweeps` with the given overrides, writing into run_dir."""
    args = [sys.executable, "-m", "dpo_sweeps", *(QUIET if quiet else []), *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout)
    return RunResult(proc.returncode, proc.stdout, proc.stderr, Path(run_dir))


def require_tcmalloc() -> str:
    """tcmalloc's library (resources.cpu_allocator=tcmalloc), which tests/install_system_deps.sh installs;
    without it the test skips, except under CI (the CI variable set), where it fails."""
    import pytest

    from dpo_sweeps.parallel.allocator import allocator_library

    if library := allocator_library("tcmalloc"):
        return library
    message = "tcmalloc not found: apt-get install -y --no-install-recommends libtcmalloc-minimal4"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI must run the tcmalloc tests, not skip them)")
    pytest.skip(message)
