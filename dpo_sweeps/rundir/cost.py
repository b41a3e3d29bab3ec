"""What an attempt cost (summary.json's started_at, ended_at, wall_s, device_seconds, device_kind), and
device time in words for people."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any


def run_cost(started_at: float, ranks: int, on_gpu: bool, ended_at: float | None = None) -> dict[str, Any]:
    """What an attempt cost, for summary.json: UTC start and end (ISO 8601), wall seconds, and device-seconds
    (ranks x wall: GPU-seconds on GPUs, rank-seconds of cores bound to ranks on a CPU)."""
    ended_at = time.time() if ended_at is None else ended_at
    wall = max(0.0, ended_at - started_at)

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")

    return {"started_at": iso(started_at), "ended_at": iso(ended_at), "wall_s": round(wall, 3),
            "device_seconds": round(ranks * wall, 3), "device_kind": "gpu" if on_gpu else "cpu"}


def device_time_text(seconds: dict[str, float] | None) -> str:
    """Summed device_seconds by device_kind, for people: '1.25 GPU-hours' and/or '740 CPU rank-seconds'."""
    seconds = seconds or {}
    parts = [f"{seconds['gpu'] / 3600:.2f} GPU-hours"] if seconds.get("gpu") else []
    if seconds.get("cpu") or not parts:
        parts.append(f"{seconds.get('cpu', 0.0):.0f} CPU rank-seconds")
    return " + ".join(parts)
