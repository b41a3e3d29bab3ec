"""metrics.jsonl: one JSON object per logged step, each one complete line written in a single call."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from dpo_sweeps.rundir.atomic import finite_or_none
from dpo_sweeps.rundir.paths import writing

METRICS = "metrics.jsonl"


class MetricsLog:
    """Appends one JSON object per logged step to metrics.jsonl."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps({k: finite_or_none(v) for k, v in record.items()}) + "\n").encode()
        with writing(self.path):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                end = os.fstat(fd).st_size
                try:
                    rest = memoryview(line)
                    while rest:  # one call, unless the disk fills in the middle of the line
                        rest = rest[os.write(fd, rest):]
                except OSError:
                    os.ftruncate(fd, end)  # no half line after the whole ones
                    raise
            finally:
                os.close(fd)

    def truncate_after(self, step: int) -> None:
        """Drop records past `step` (a resumed run rewrites them)."""
        if not self.path.exists():
            return
        keep = [line for line in self.path.read_text().splitlines(keepends=True) if _record_step(line) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        try:
            with writing(self.path):
                tmp.write_text("".join(keep))
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.path)


def _record_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's whole records, in file order (none when there is no file; a half line is left out)."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records
