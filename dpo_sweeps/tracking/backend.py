"""What a tracking backend does, and which are known: the one interface every tracker module implements.

A backend is told a run (`start`), how far it already holds each metric (`logged_steps`, so that a resumed
run or a second upload writes nothing twice), each metrics.jsonl record (`log`) and how the run ended
(`finish`). Its library is imported when the backend is built, never before: `REGISTRY` names the module
and the pip command, so a missing library is refused before any job starts (`missing_libraries`).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dpo_sweeps.config.schema import Config
from dpo_sweeps.tracking.run_info import RunInfo


@dataclass(frozen=True)
class RunEnd:
    """How a run ended, for `finish`."""

    status: str
    """summary.json's status: completed, failed, pruned (or skipped)."""
    failure_kind: str | None
    summary_path: Path | None
    """summary.json, logged as an artifact by the backends that keep artifacts."""


class Backend(Protocol):
    name: str
    where: str
    """The URI or directory the backend writes to, for warnings and summary.json's `tracking`."""

    def start(self, run: RunInfo, state: dict[str, Any] | None) -> dict[str, Any]:
        """Open the run, or continue the one `state` (what an earlier `start` returned) names; returns the
        state to continue it with (tracking.json)."""

    def logged_steps(self) -> dict[str, int]:
        """The last step the tracker holds of each metric ("*": of every metric); {} for a new run."""

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def finish(self, end: RunEnd) -> None: ...


@dataclass(frozen=True)
class Known:
    module: str
    library: str
    pip: str


REGISTRY: dict[str, Known] = {
    "wandb": Known("dpo_sweeps.tracking.wandb_backend", "wandb", "pip install wandb"),
    "mlflow": Known("dpo_sweeps.tracking.mlflow_backend", "mlflow", "pip install 'mlflow>=3'"),
    # torch.utils.tensorboard writes the files; it needs the tensorboard package (its protobufs).
    "tensorboard": Known("dpo_sweeps.tracking.tensorboard_backend", "tensorboard", "pip install tensorboard"),
    "trackio": Known("dpo_sweeps.tracking.trackio_backend", "trackio", "pip install trackio"),
}


def missing_libraries(backends: list[str]) -> list[tuple[str, Known]]:
    """The chosen backends whose library is not installed (found without importing it)."""
    return [(name, REGISTRY[name]) for name in backends
            if name in REGISTRY and importlib.util.find_spec(REGISTRY[name].library) is None]


def build_backend(name: str, cfg: Config, run_dir: Path) -> Backend:
    """The backend `name` of this config (its library imported here)."""
    return importlib.import_module(REGISTRY[name].module).build(cfg, run_dir)
