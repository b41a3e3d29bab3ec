"""What a run leaves in its directory: metrics.jsonl, summary.json (INTERFACE.md), saved model.

Writes are atomic where a reader may look: summary.json goes through a temporary file and a rename,
each metrics.jsonl record is one complete line written in a single call.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.rundir.paths import writing

SCHEMA = 1
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
RANK_FAILURES = "rank_failures"
# In a sweep directory: the staged search's answer (launchers/find_best.py writes it, the report reads it).
FIND_BEST = "find_best.json"
# Space held for summary.json from the start of a run, so a full disk still gets its summary.
SUMMARY_RESERVE = ".summary_reserve"
SUMMARY_RESERVE_BYTES = 256 * 1024

# Keys that do not change what a run computes: they are left out of config_hash, so a resumed or
# re-launched sweep recognises its finished runs.
NON_DEFINING_KEYS = (
    "wandb",
    "train.progress_bar",
    "resources.master_port",
    "resources.collective_timeout_s",
    "resources.hang_timeout_s",
    "train.time_limit_min",
    "checkpoint",  # when and how many checkpoints are kept does not change the results (exact resume)
    "model.install_hint",
)
# Keys added after runs were written, with the value that trains as those runs did: dropped at that
# value, so that the runs' sweep directories still resume.
ADDED_KEYS = {"model.gguf_file": None, "data.chat_template": "auto", "train.zero_shot_eval": False,
              "train.sample_prompts": 0, "train.sample_max_new_tokens": 64}
# A key is secret when its name is one of these or ends with "_" + one of them (so `hf_token` is,
# `tokenizer` and `max_tokens` are not).
SECRET_NAMES = ("api_key", "apikey", "token", "secret", "password", "passwd", "credentials")
REDACTED = "<redacted>"

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


def is_secret_key(key: str) -> bool:
    name = str(key).lower().rsplit(".", 1)[-1]
    return any(name == s or name.endswith("_" + s) for s in SECRET_NAMES)


def scrub_secrets(value: Any) -> Any:
    """A copy of a config tree with any secret key's value replaced."""
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_key(k) and v is not None else scrub_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_secrets(v) for v in value]
    return value


def scrub_overrides(overrides: list[str]) -> list[str]:
    """Hydra override strings with the value of any secret key replaced."""
    out = []
    for override in overrides:
        key, sep, _ = override.partition("=")
        out.append(f"{key}={REDACTED}" if sep and is_secret_key(key.lstrip("+~")) else override)
    return out


def secret_values(config: Any, environ: dict[str, str]) -> set[str]:
    """The secret strings a run knows: values of secret config keys and of secret environment variables."""
    found: set[str] = {v for k, v in environ.items() if is_secret_key(k) and len(v) >= 6}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if is_secret_key(k) and isinstance(v, (str, int)) and len(str(v)) >= 6:
                    found.add(str(v))
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(config)
    return found


def redact_files(paths: list[Path], secrets: set[str]) -> None:
    """Replace every occurrence of a secret in these text files (Hydra's saved .hydra/*.yaml)."""
    for path in paths:
        if not secrets or not path.exists():
            continue
        text = path.read_text()
        redacted = text
        for secret in secrets:
            redacted = redacted.replace(secret, REDACTED)
        if redacted != text:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(redacted)
            os.replace(tmp, path)


def _drop_key(tree: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.get(part)
        if not isinstance(tree, dict):
            return
    tree.pop(leaf, None)


def config_hash(config: dict) -> str:
    """A stable hash of the resolved config keys that define the run.

    The loss-scale settings count only where loss scaling is on: the typed schema gives every precision
    preset them (before it, only fp16 had them), and runs written before it must keep their hash, so that
    their sweep directories still resume."""
    defining = json.loads(json.dumps(config))
    for key in NON_DEFINING_KEYS:
        _drop_key(defining, key)
    for key, former in ADDED_KEYS.items():
        section, _, name = key.partition(".")
        if isinstance(defining.get(section), dict) and defining[section].get(name, former) == former:
            _drop_key(defining, key)
    precision = defining.get("precision")
    if isinstance(precision, dict) and not precision.get("loss_scaling"):
        for key in ("initial_loss_scale", "loss_scale_growth_interval"):
            precision.pop(key, None)
    blob = json.dumps(defining, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def config_difference(saved: dict, current: dict, limit: int = 4) -> str:
    """The keys that differ between two configs, `key: old -> new`, the first `limit` of them."""
    before, after = _flat(saved), _flat(current)
    keys = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    shown = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN or inf: they are written as null, at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with writing(path), os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """`path` through a temporary file and a rename: a failed write (a full disk) leaves the previous
    file whole and no temporary file behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with writing(path):
            tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    summary = _finite_or_none(summary)
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


class MetricsLog:
    """Appends one JSON object per logged step to metrics.jsonl."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS

    def append(self, record: dict[str, Any]) -> None:
        line = (json.dumps({k: _finite_or_none(v) for k, v in record.items()}) + "\n").encode()
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


def write_rank_failure(run_dir: Path, reported_by: int, failure: dict, *, collective: bool) -> None:
    """Record what rank `reported_by` saw: its own failure (`failure` without a `rank`), or a verdict
    about another rank (a hang). `collective`: it only saw a peer go away. Best effort: a full disk
    must not hide the failure being handled."""
    import time

    record = dict(failure)
    if record.get("rank") is None:  # this rank's own failure
        record.update(rank=reported_by, cause=failure["message"], message=f"rank {reported_by}: {failure['message']}")
    record.update(reported_by=reported_by, time=time.time(), collective=collective)
    try:
        write_json_atomic(Path(run_dir) / RANK_FAILURES / f"rank{reported_by}.json", record)
    except OSError:
        pass


def read_rank_failures(run_dir: Path) -> list[dict]:
    folder = Path(run_dir) / RANK_FAILURES
    out = []
    for path in sorted(folder.glob("rank*.json")) if folder.exists() else []:
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


FAILURE_FIELDS = ("kind", "message", "rank", "step", "cause")


def first_failure(run_dir: Path, ended: Sequence[tuple[int, str]] = ()) -> dict | None:
    """The failure of the rank that failed first on its own: the one place that works it out.

    By evidence, best first: the earliest failure a rank recorded of itself; else the earliest verdict
    about a rank (a hang); else the first of `ended`, the ranks a supervisor saw end without saying why,
    as (rank, how it ended) in the order seen (exit codes, tasks without a result, srun's log). Ranks
    that only saw a peer go away never count. `reported_by` is the rank that recorded it (None: it
    comes from `ended`). None: nobody knows.
    """
    reports = [r for r in read_rank_failures(run_dir) if not r.get("collective")]
    own = [r for r in reports if r.get("rank") == r.get("reported_by")]
    found = min(own or reports, key=lambda r: r["time"], default=None)
    if found is not None:
        return {k: found.get(k) for k in (*FAILURE_FIELDS, "reported_by")}
    if not ended:
        return None
    message = "; ".join(how for _, how in ended)
    return {**Failure(FailureKind.CRASH, message, rank=ended[0][0]).record(), "reported_by": None}
