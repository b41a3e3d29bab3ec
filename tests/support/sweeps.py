"""Run real sweeps (`python -m dpo_sweeps -m ...`) in a subprocess and read what they left.

Shared by tests/integration/test_sweeps.py, tests/integration/test_sweeps_slurm.py and tests/integration/test_optuna.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support import QUIET, REPO, cli_env

# Short runs on small synthetic data: a few seconds of training after ~10 s of start-up per job.
FAST = [*QUIET, "train.eval_every=0", "data.num_train_pairs=512", "data.num_eval_pairs=64"]


@dataclass
class SweepResult:
    returncode: int
    stdout: str
    stderr: str
    sweep_dir: Path

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def summary(self, num: int | str) -> dict:
        return json.loads((self.sweep_dir / str(num) / "summary.json").read_text())

    def run_dirs(self) -> list[Path]:
        return sorted((p for p in self.sweep_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def run_sweep(sweep_dir: Path, *overrides: str, timeout: float = 600, env: dict[str, str] | None = None) -> SweepResult:
    """`python -m dpo_sweeps -m FAST... overrides... hydra.sweep.dir=sweep_dir` from the repository root."""
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *FAST, *overrides, f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(args, cwd=REPO, env={**cli_env(), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    return SweepResult(proc.returncode, proc.stdout, proc.stderr, Path(sweep_dir))


def run_dir_form(run_dir: Path) -> set[str]:
    """The files a run directory holds, as relative paths (log files by suffix: their name is Hydra's job name)."""
    files = set()
    for path in run_dir.rglob("*"):
        if path.is_file() and path.name != ".lock":
            rel = path.relative_to(run_dir)
            files.add(f"*{path.suffix}" if path.suffix == ".log" and len(rel.parts) == 1 else str(rel))
    return files


# What every completed run of a sweep leaves, whichever launcher ran it (checkpoints are removed
# when a run completes; save_model is off in FAST).
COMPLETED_RUN_FORM = {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "*.log",
                      "metrics.jsonl", "eval_pairs.parquet", "summary.json"}
# A probe's: its one eval pass is timed, not kept (no eval_pairs.parquet).
PROBE_RUN_FORM = COMPLETED_RUN_FORM - {"eval_pairs.parquet"}
