"""How a run ends: every way, its one printed line and its exit status, decided here only.

| how the run ended                                   | a single run prints (stderr)                    | exit | in a sweep          |
| --------------------------------------------------- | ----------------------------------------------- | ---- | ------------------- |
| completed                                           | `run completed: DIR (N steps in T s): metrics`  | 0    | its metrics         |
| refused before launch (a setting, an unwritable or  | `error: <setting>: <why> (accepted: ...)`       | 1    | RunFailed(kind)     |
| taken run directory, the config Hydra rejects)      |                                                 |      |                     |
| failed with a kind (oom, nan, data_error, crash...) | `error: run failed (KIND): why  [summary.json]` | 1    | RunFailed(kind)     |
| pruned (an Optuna trial)                            | `error: run pruned: why  [summary.json]`        | 1    | RunFailed(pruned)   |
| preempted, or stopped by a signal or its time limit | the failed line above (kind preempted/timeout)  | 1    | RunFailed(kind)     |
|                                                     | unless the job is requeued (train/lifecycle.py) |      |                     |
| interrupted (Ctrl-C) before the run started         | `error: interrupted (Ctrl-C) before ...`        | 130  | (Hydra's own)       |

Another rank than rank 0 prints nothing (rank 0 says it) and exits 1 when the run did not complete.
`__main__` (Hydra's errors, before any run), the task function (`task.run`) and the Python API
(`dpo_sweeps.api.train`, which raises the refusal's InvalidConfig instead of printing it) all end
through this module. The two exception types: `RunRefused` for a run that will not start (its
`failure` holds the kind and the setting) and `RunFailed` for a sweep's run that did not complete
(its `kind` says how).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hydra.errors import CompactHydraException

from dpo_sweeps.errors import RunFailure, say
from dpo_sweeps.rundir.summary import Status, Summary
from dpo_sweeps.runtime.startup import INTERRUPTED_BEFORE_START

# What the line a completed run ends with shows (INTERFACE.md's names): the quality and the cost the
# report ranks configs by.
HEADLINE_METRICS = ("eval/rewards/accuracies", "eval/loss", "perf/tokens_per_s", "perf/peak_memory_gib")
INTERRUPTED_STATUS = 130  # as a shell reports a process ended by SIGINT


class RunRefused(Exception):
    """A run that will not train: `failure` names the setting at fault (or the path) and what is accepted;
    its `kind` is the failure's kind.

    `line`: what the command prints; `nothing_written`: the run directory Hydra made is still empty
    (it goes); `quiet`: another rank (torchrun's rank 0) says it."""

    def __init__(self, failure: RunFailure, *, line: str | None = None, nothing_written: bool = False,
                 quiet: bool = False):
        super().__init__(str(failure))
        self.failure = failure
        self.kind = failure.kind
        self.line = line or f"error: {failure}"
        self.nothing_written = nothing_written
        self.quiet = quiet


class RunFailed(CompactHydraException):
    """Raised to the sweep (multirun) when a run did not complete; its message is one line, `kind` says how."""

    def __init__(self, message: str, kind: str = "crash"):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Ending:
    """How one run ended: the line a single run prints (None: nothing, another rank says it), its exit
    status, and for a run that did not complete, the kind and the message a sweep is told."""

    line: str | None
    status: int
    kind: str | None = None
    message: str | None = None
    quiet: bool = False  # a refusal another rank says: this process only exits, in a sweep too

    @property
    def completed(self) -> bool:
        return self.status == 0


def refused(exc: RunRefused) -> Ending:
    return Ending(None if exc.quiet else exc.line, 1, exc.kind, str(exc.failure), quiet=exc.quiet)


def ended(summary: Summary, run_dir: Path) -> Ending:
    """The ending of a run that started (completed, failed, pruned, stopped) from its summary."""
    if summary.status == Status.COMPLETED:
        return Ending(completed_line(summary, run_dir) if summary.rank == 0 else None, 0)
    failure = summary.failure
    kind = str(failure.kind) if failure is not None else "crash"
    if summary.rank != 0:  # another rank: rank 0 says what failed; a sweep only needs our status
        return Ending(None, 1, kind, f"rank {summary.rank}: run {summary.status}")
    where = f"  [{run_dir / 'summary.json'}]" if summary.written else ""
    verdict = "run pruned" if summary.status == Status.PRUNED else f"run failed ({kind})"
    message = f"{verdict}: {failure.message}{where}"
    return Ending(f"error: {message}", 1, kind, message)


def error_line(message: object) -> Ending:
    """A command refused before any run (Hydra's own errors, a removed config group, the schema's)."""
    return Ending(f"error: {message}", 1, "invalid_config", str(message))


INTERRUPTED = Ending(INTERRUPTED_BEFORE_START, INTERRUPTED_STATUS, "interrupted", INTERRUPTED_BEFORE_START)


def finish(ending: Ending) -> None:
    """End this process as the single run (or command) `ending` says: its line, then its exit status."""
    if ending.line is not None:
        say(ending.line)
    if ending.status != 0:
        sys.exit(ending.status)


def finish_in_sweep(ending: Ending) -> None:
    """A sweep's run: the sweep's own screen lists how its runs ended; one that did not complete raises."""
    if ending.quiet:
        sys.exit(ending.status)
    if not ending.completed:
        raise RunFailed(ending.message or "run failed", ending.kind or "crash")


def completed_line(summary: Summary, run_dir: Path) -> str:
    """`run completed: DIR (N steps in T s): metric value, ...`: where a single run's results are, and its
    headline metrics (those it logged: without an eval, none of eval/)."""
    metrics = summary.metrics
    shown = [f"{name} {_figure(metrics[name])}" for name in HEADLINE_METRICS if metrics.get(name) is not None]
    took = f" in {summary.wall_s:,.0f} s" if summary.wall_s is not None else ""
    return f"run completed: {run_dir} ({metrics['steps']} steps{took}): {', '.join(shown)}"


def _figure(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
