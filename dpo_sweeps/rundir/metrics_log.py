"""metrics.jsonl: one JSON object per logged step, each one complete line written in a single call."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from dpo_sweeps.rundir.atomic import finite_or_none

METRICS = "metrics.jsonl"


class MetricsLog:
    """Appends one JSON object per logged step to metrics.jsonl."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps({k: finite_or_none(v) for k, v in record.items()}) + "\n"
        with open(self.path, "a") as f:
            f.write(line)

    def truncate_after(self, step: int) -> None:
        """Drop records past `step` (a resumed run rewrites them)."""
        if not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines(keepends=True) if _record_step(line) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(keep))
        os.replace(tmp, self.path)


def _record_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf
