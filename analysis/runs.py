"""Read run directories (INTERFACE.md, "A run's directory") into `Run` records.

A run directory holds Hydra's `.hydra/`, `metrics.jsonl` and, once the run has ended,
`summary.json`. A run without `summary.json` is still going (pending). Sweep directories
(Hydra's multirun folders, Optuna sweeps) are found on the way down.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.parallel.plan import resolve_plan

# summary.json is read as its writers write it: one record, one source of truth (rundir/summary.py).
from dpo_sweeps.rundir.hashing import NON_DEFINING_KEYS
from dpo_sweeps.rundir.summary import STATUSES, SUMMARY, Status, SummaryUnreadable, load_summary
from dpo_sweeps.rundir.summary import SUMMARY_METRIC_KEYS as SUMMARY_METRICS  # noqa: F401 (analysis/ reads it here)

SPEED_PER_MEMORY = "perf/speed_per_memory"
PREFERENCE_ACCURACY = "eval/rewards/accuracies"
# Beside summary.json's metrics, the tables show how a run's rows were laid out and compiled
# (train.packing, train.compile): the share of computed positions that were padding, and the first
# step's compile time, this one only where a run compiled (every other run writes it null).
PADDING_FRACTION = "perf/padding_fraction"
COMPILE_S = "perf/compile_s"
# pruned: stopped at an evaluation by the Optuna pruner; skipped: not started, predicted out of memory
# (kind oom_predicted). Both are results, like failures.
FINISHED_STATUSES = STATUSES

# Config keys that only pick the replicate: runs that differ in these alone are one config
# run with several seeds.
SEED_KEYS = frozenset({"train.seed"})

# A folder holding one of these is a sweep directory (Hydra multirun, Optuna sweeper).
SWEEP_MARKERS = ("multirun.yaml", "optimization_results.yaml", "optuna.db")


class NoRunsError(Exception):
    """A directory given to the report holds no run directories."""


@dataclass
class Run:
    """One run directory, as far as it has been written."""

    path: Path
    # Path relative to the directory the report was given (prefixed when given several).
    name: str
    # The nearest sweep directory above the run, else the directory the report was given.
    sweep: Path
    # completed | failed | pending (no summary.json yet) | unreadable (summary.json is bad)
    status: str
    overrides: tuple[str, ...] = ()
    # The resolved config, flattened to dotted keys ("loss.beta").
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    failure_kind: str | None = None
    failure_message: str | None = None
    config_hash: str | None = None
    # What the run cost (summary.json): ranks x wall seconds, on "gpu" or "cpu".
    device_seconds: float | None = None
    device_kind: str = "cpu"
    # Whether metrics.jsonl holds any record, and the last step it logged (the records themselves are
    # read again where they are drawn: `log`; a sweep of 10,000 runs would hold gigabytes of them).
    has_log: bool = False
    last_logged_step: int | None = None
    # What was odd about the files (skipped log lines, an unreadable summary).
    problems: list[str] = field(default_factory=list)
    # The parallel plan as the run resolved it (summary.json's `plan`), else as its config resolves.
    plan: dict[str, Any] | None = None
    # How many held-out pairs its evals scored (summary.json's data.eval_pairs); None when not written.
    eval_pairs: int | None = None

    def metric(self, name: str) -> float:
        """A summary metric as a float; NaN where it is missing or null."""
        value = self.metrics.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return math.nan
        return float(value)

    @property
    def is_probe(self) -> bool:
        """A probe run (probe.steps > 0): speed and memory only, no preference accuracy."""
        return "probe/steps" in self.metrics

    @property
    def log(self) -> list[dict[str, Any]]:
        """metrics.jsonl records, in file order (read from the file each time)."""
        return read_log(self.path / "metrics.jsonl")[0]

    @property
    def strategy_label(self) -> str | None:
        """The sharding that ran (FULL_SHARD, SHARD_GRAD_OP, ...: the plan's), with the adapters it trained
        (`FULL_SHARD LoRA r=16`: the heatmap keeps them apart from full fine-tunes), else the config's name."""
        if not self.plan:
            return self.config.get("fsdp.sharding_strategy")
        adapters = self.plan.get("adapters")  # absent from summaries older than peft
        return f"{self.plan['strategy']} {adapters}" if adapters else self.plan["strategy"]

    @property
    def precision_label(self) -> str | None:
        """The precision that ran (bf16, ...: the plan's), else the config's name for it."""
        return self.plan["precision"] if self.plan else self.config.get("precision.name")

    @cached_property
    def settings(self) -> dict[str, Any]:
        """Override key -> value as YAML reads it: {"fsdp": "full_shard", "loss.beta": 0.1}."""
        return {override_key(o): override_value(o) for o in self.overrides}

    @property
    def config_overrides(self) -> tuple[str, ...]:
        """The overrides without the seed ones: what sets this config apart in its sweep."""
        return tuple(o for o in self.overrides if override_key(o) not in SEED_KEYS)

    @property
    def config_key(self) -> tuple:
        """Equal for runs of the same config, whatever their seed.

        Like the trainer's config_hash, it leaves out the keys that do not change what a run
        computes (`NON_DEFINING_KEYS`: wandb, ports, ...), and it leaves out the seed.
        """
        if not self.config:
            return ("overrides", tuple(sorted(self.config_overrides)))
        defining = (
            (key, json.dumps(value, sort_keys=True, default=str))
            for key, value in self.config.items()
            if key not in SEED_KEYS and not any(key == k or key.startswith(f"{k}.") for k in NON_DEFINING_KEYS)
        )
        return ("config", tuple(sorted(defining)))


def report_metrics(runs: list[Run]) -> tuple[str, ...]:
    """The metrics the report's tables show of these runs: summary.json's (SUMMARY_METRICS), the padding
    share, and the compile time where some run has one."""
    compiled = any(math.isfinite(r.metric(COMPILE_S)) for r in runs)
    return (*SUMMARY_METRICS, PADDING_FRACTION, *((COMPILE_S,) if compiled else ()))


def count_probes(runs: list[Run]) -> int:
    """How many of `runs` completed as probes (probe.steps: speed and memory only)."""
    return sum(1 for r in runs if r.status == "completed" and r.is_probe)


def override_key(override: str) -> str:
    """`+train.seed=1` -> `train.seed`; `fsdp=full_shard` -> `fsdp`."""
    return override.split("=", 1)[0].lstrip("+~")


def override_value(override: str) -> Any:
    """The value of an override as YAML reads it (`loss.beta=0.1` -> 0.1), else the text."""
    text = override.split("=", 1)[1] if "=" in override else ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"loss": {"beta": 0.1}} -> {"loss.beta": 0.1}; already dotted keys stay as they are."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _natural_key(path: Path) -> list:
    # Job folders 0..N sort as numbers: 2 before 10.
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def is_run_dir(path: Path) -> bool:
    return (path / SUMMARY).is_file() or (path / ".hydra").is_dir()


def discover(root: Path) -> tuple[list[Path], list[Path]]:
    """Run directories and sweep directories at or under `root`, in natural order."""
    if is_run_dir(root):
        return [root], []
    run_dirs, sweep_dirs = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if any(marker in filenames for marker in SWEEP_MARKERS):
            sweep_dirs.append(here)
        if is_run_dir(here):
            run_dirs.append(here)
            dirnames[:] = []
            continue
        # Hidden folders are Hydra's and submitit's own (.hydra, .submitit), never runs.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
    return sorted(run_dirs, key=_natural_key), sorted(sweep_dirs, key=_natural_key)


def read_log(path: Path, ended: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    """metrics.jsonl records and the problems met. A half-written last line is no problem while the run
    goes on (its writer may be in the middle of it); once the run has `ended` it is one, like any other."""
    if not path.is_file():
        return [], []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    try:  # the usual file, every line a record: parsed in one go
        records = json.loads("[" + ",".join(line for line in lines if line.strip()) + "]")
        if all(isinstance(r, dict) and isinstance(r.get("step"), int) for r in records):
            return records, []
    except json.JSONDecodeError:
        pass
    records, problems = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number < len(lines) or ended:
                problems.append(f"{path.name} line {number} is not JSON; skipped")
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        else:
            problems.append(f"{path.name} line {number} has no integer 'step'; skipped")
    return records, problems


def _read_yaml(path: Path, problems: list[str]) -> Any:
    """A run's .hydra/ file, parsed; None when absent or unreadable (then said in `problems`, naming it)."""
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        problems.append(f"{path.parent.name}/{path.name} is not readable YAML ({first}); not used")
        return None


def read_run(path: Path, name: str, sweep: Path) -> Run:
    """One run directory: from summary.json when it has ended, from .hydra/ while pending."""
    ended = (path / SUMMARY).is_file()
    log, problems = read_log(path / "metrics.jsonl", ended=ended)
    steps = [r["step"] for r in log]
    run = Run(path=path, name=name, sweep=sweep, status="pending", has_log=bool(log),
              last_logged_step=max(steps) if steps else None, problems=problems)
    hydra_overrides = _read_yaml(path / ".hydra" / "overrides.yaml", run.problems)
    if isinstance(hydra_overrides, list):
        run.overrides = tuple(str(o) for o in hydra_overrides)
    hydra_config = _read_yaml(path / ".hydra" / "config.yaml", run.problems)
    if isinstance(hydra_config, dict):
        run.config = flatten(hydra_config)
        run.plan = plan_of(hydra_config)

    if not ended:
        return run
    try:
        summary = load_summary(path)
    except SummaryUnreadable as problem:
        run.status = "unreadable"
        run.problems.append(str(problem))
        return run

    run.status = str(summary.status)
    if summary.overrides:
        run.overrides = tuple(summary.overrides)
    if summary.config:
        run.config = flatten(summary.config)
        run.plan = plan_of(summary.config)
    if isinstance(summary.plan, dict):
        run.plan = summary.plan
    run.metrics = dict(summary.metrics)
    eval_pairs = (summary.data or {}).get("eval_pairs")
    if isinstance(eval_pairs, int) and not isinstance(eval_pairs, bool) and eval_pairs > 0:
        run.eval_pairs = eval_pairs
    run.config_hash = summary.config_hash
    if isinstance(summary.device_seconds, (int, float)):
        run.device_seconds = float(summary.device_seconds)
        run.device_kind = str(summary.device_kind or "cpu")
    if summary.failure is not None and summary.status != Status.COMPLETED:
        run.failure_kind = str(summary.failure.kind or "crash")
        run.failure_message = summary.failure.message
    return run


def plan_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """The parallel plan block (summary.json's `plan`) a resolved config resolves to; None for a config
    without the groups it needs (a run that ended before it wrote one, a trimmed config)."""
    try:
        return resolve_plan(Config.of(config)).as_dict()
    except (AttributeError, KeyError, TypeError, ValueError, InvalidConfig):
        return None


def nearest_sweep(run_dir: Path, sweep_dirs: list[Path], root: Path) -> Path:
    """The sweep a run is a job of: the nearest sweep directory above it (a find_best's root, above its
    stages' folders), else `root`."""
    for parent in (run_dir, *run_dir.parents):
        if parent in sweep_dirs:
            return parent
        if parent == root:
            break
    return root


def load_runs(roots: list[Path]) -> tuple[list[Run], list[Path]]:
    """Every run under the given directories, and the sweep directories met.

    Raises FileNotFoundError for a path that is not a directory and NoRunsError for one
    that holds no run directory.
    """
    roots = [Path(r) for r in roots]
    for root in roots:
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: not a directory; expected a sweep directory such as multirun/DATE/TIME")
    common = Path(os.path.commonpath([r.resolve() for r in roots])) if len(roots) > 1 else None
    runs: list[Run] = []
    all_sweeps: list[Path] = []
    seen: set[Path] = set()
    for root in roots:
        run_dirs, sweep_dirs = discover(root)
        if not run_dirs:
            raise NoRunsError(
                f"{root}: no runs found; expected run directories holding summary.json or .hydra/ "
                "(a sweep directory such as multirun/DATE/TIME, or one run's output directory)"
            )
        prefix = root.resolve().relative_to(common) if common else Path()
        for run_dir in run_dirs:
            if run_dir.resolve() in seen:  # given twice, or under two of the given directories
                continue
            seen.add(run_dir.resolve())
            if run_dir != root:
                relative = run_dir.relative_to(root)
            else:  # a run directory given itself: named by its folder, once
                relative = Path() if prefix.parts else Path(root.resolve().name)
            name = (prefix / relative).as_posix()
            runs.append(read_run(run_dir, name, nearest_sweep(run_dir, sweep_dirs, root)))
        all_sweeps.extend(s for s in sweep_dirs if s not in all_sweeps)
    return runs, all_sweeps
