"""JSON written so that a reader never sees half of it: a temporary file, fsync, a rename; NaN and inf
as null (JSON has neither)."""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from dpo_sweeps.rundir.paths import writing


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN or inf: they are written as null, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value


def temporary_beside(path: Path) -> Path:
    """A fresh temporary name in `path`'s folder. Never a fixed one: two processes writing the same file
    (two sweeps sharing one study folder write its multirun.yaml) would rename each other's temporary."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def write_text_atomic(path: Path, text: str) -> None:
    """`path` through a temporary file, fsync and a rename: a reader never sees half of it, and a failed
    write (a full disk) leaves the previous file whole and no temporary file behind."""
    path = Path(path)
    tmp = temporary_beside(path)
    try:
        with writing(path), open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")
