"""A run's checkpoints as files: which are complete, which are intact, and removing them.

    <run dir>/checkpoints/step_<N>/          complete: holds the COMPLETE marker (JSON, every file's size)
    <run dir>/checkpoints/step_<N>.tmp/      being written (or left by a killed save)
    <run dir>/checkpoints/step_<N>.deleting/ being deleted
    <run dir>/checkpoints/step_<N>.broken/   complete once, found damaged at a resume

Plain file operations, no torch: the process that owns a run directory clears what an interrupted
attempt left before any rank starts, and tests and launchers read what a run saved. Writing and
loading a checkpoint is dpo_sweeps.train.checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
MARKER = "COMPLETE"
_COMPLETE_NAME = re.compile(r"^step_(\d+)$")
_LEFTOVER_SUFFIXES = (".tmp", ".deleting")
BROKEN_SUFFIX = ".broken"


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    marker: dict


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def complete_checkpoints(run_dir: Path) -> list[CheckpointInfo]:
    """The run's complete checkpoints, oldest first (what a reader may trust)."""
    folder = checkpoints_dir(run_dir)
    found = []
    for path in folder.iterdir() if folder.is_dir() else []:
        match = _COMPLETE_NAME.match(path.name)
        if not match:
            continue
        try:
            marker = json.loads((path / MARKER).read_text())
        except (OSError, ValueError):
            continue
        found.append(CheckpointInfo(int(match.group(1)), path, marker))
    return sorted(found, key=lambda c: c.step)


def checkpoint_problem(info: CheckpointInfo) -> str | None:
    """Why a complete checkpoint cannot be loaded (a file missing or of the wrong size), or None.
    Checkpoints written before markers listed their files pass unchecked."""
    for name, size in sorted((info.marker.get("files") or {}).items()):
        path = info.path / name
        try:
            found = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if found != size:
            return f"{name} has {found} of its {size} bytes"
    return None


def latest_checkpoint(run_dir: Path) -> CheckpointInfo | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Drop the half-written or half-deleted folders an interrupted attempt left (not collective)."""
    folder = checkpoints_dir(run_dir)
    for path in folder.iterdir() if folder.is_dir() else []:
        if path.name.endswith(_LEFTOVER_SUFFIXES):
            log.info("removing %s, left by an interrupted attempt", path)
            shutil.rmtree(path, ignore_errors=True)


def remove_checkpoints(run_dir: Path, reason: str) -> None:
    """Delete every checkpoint of the run directory (not collective)."""
    folder = checkpoints_dir(run_dir)
    if folder.is_dir():
        log.info("removing %s (%s)", folder, reason)
        shutil.rmtree(folder, ignore_errors=True)
