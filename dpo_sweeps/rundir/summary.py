"""summary.json (INTERFACE.md): written atomically when a run ends, completed or failed, and read by the
launchers, the sweepers and the report. Space is held for it from the start, so a full disk still gets it."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

from dpo_sweeps.rundir.atomic import finite_or_none, write_json_atomic
from dpo_sweeps.rundir.hashing import config_hash
from dpo_sweeps.rundir.secrets import scrub_overrides, scrub_secrets

SCHEMA = 1

SUMMARY = "summary.json"

# Space held for summary.json from the start of a run, so a full disk still gets its summary.
SUMMARY_RESERVE = ".summary_reserve"
SUMMARY_RESERVE_BYTES = 256 * 1024

PERF_METRIC_KEYS = (
    "perf/tokens_per_s",
    "perf/tokens_per_s_per_device",
    "perf/examples_per_s",
    "perf/peak_memory_gib",
    "perf/speed_per_memory",
    "perf/step_time_s",
    "perf/mfu",
)
SUMMARY_METRIC_KEYS = (
    "eval/rewards/accuracies",
    "eval/rewards/margins",
    "eval/loss",
    "train/loss",
    *PERF_METRIC_KEYS,
    "steps",
    "world_size",
)


def write_summary(
    run_dir: Path,
    *,
    status: str,
    failure: dict | None,
    overrides: list[str],
    config: dict,
    metrics: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> dict:
    config = scrub_secrets(config)
    all_metrics = {key: None for key in SUMMARY_METRIC_KEYS}
    all_metrics.update(metrics)
    summary = {
        "schema": SCHEMA,
        "status": status,
        "failure": failure,
        "overrides": scrub_overrides(list(overrides)),
        "config_hash": config_hash(config),
        "config": config,
        "metrics": all_metrics,
    }
    if extra:
        summary.update(extra)
    summary = finite_or_none(summary)
    reserve = Path(run_dir) / SUMMARY_RESERVE
    try:
        write_json_atomic(Path(run_dir) / SUMMARY, summary)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not reserve.exists():
            raise
        reserve.unlink()  # the disk is full: the space held for this moment
        write_json_atomic(Path(run_dir) / SUMMARY, summary)
    reserve.unlink(missing_ok=True)
    return summary

# What write_summary writes itself; every other key of a summary is one of its `extra`s.
SUMMARY_FIELDS = ("schema", "status", "failure", "overrides", "config_hash", "config", "metrics")


def rewrite_summary(run_dir: Path, summary: dict, **changes: Any) -> dict:
    """Write a summary read back from run_dir again with `changes` (e.g. `failure=`), keeping its extras."""
    new = {**summary, **changes}
    return write_summary(run_dir, status=new["status"], failure=new.get("failure"),
                         overrides=new.get("overrides") or [], config=new.get("config") or {},
                         metrics=new.get("metrics") or {},
                         extra={k: v for k, v in new.items() if k not in SUMMARY_FIELDS})


def reserve_summary_space(run_dir: Path) -> None:
    """Hold SUMMARY_RESERVE_BYTES for summary.json until it is written (best effort)."""
    try:
        with open(Path(run_dir) / SUMMARY_RESERVE, "wb") as f:
            f.write(b"\0" * SUMMARY_RESERVE_BYTES)
    except OSError:
        pass


def read_summary(run_dir: Path) -> dict | None:
    path = Path(run_dir) / SUMMARY
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
