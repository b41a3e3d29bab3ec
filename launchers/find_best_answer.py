"""find_best's answer (launchers/find_best.py, stage 4 included): the configs it trained, each against the best
on accuracy by the report's own test (dpo_sweeps/ranking/ties.py), the pick, and find_best.json's records of them.

A config's seeds are one candidate: the training stage's run first, then its replicates'. The pick is the
fastest per GiB of the configs tied with the best accuracy (not significantly worse on the held-out pairs).
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpo_sweeps.launchers.jobs import SweepJob, override_key
from dpo_sweeps.launchers.outcome import Outcome
from dpo_sweeps.ranking.ties import QualityRanking, SeedRun, VersusBest, compare_with_best, config_eval
from dpo_sweeps.rundir.cost import device_time_text
from dpo_sweeps.rundir.summary import Status, Summary, read_summary

SPEED = "perf/speed_per_memory"
ACCURACY = "eval/rewards/accuracies"
FULL = "full fine-tune"
SEED = "train.seed"
TRAINING_STAGE = "training stage"


def _mean(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return statistics.fmean(numbers) if numbers else None


def _finite(value: float | None) -> float | None:
    """JSON has no NaN: an untested p or an interval not computed is null."""
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


@dataclass(eq=False)  # a config is itself: two are never merged by equal figures
class Candidate:
    """One config trained in stage 3: its completed runs, one per seed, the training stage's first."""

    runs: list[Path]
    summaries: list[Summary]
    job: SweepJob | None = None  # the training stage's point, which its replicates repeat with other seeds

    @property
    def run_dir(self) -> Path:
        return self.runs[0]

    @property
    def overrides(self) -> list[str]:
        return list(self.summaries[0].overrides)

    @property
    def first_seed(self) -> int:
        return int(self.summaries[0].config["train"]["seed"])

    def metric(self, name: str) -> float | None:
        """A summary metric's mean over the seeds; None where no seed has a number."""
        return _mean([s.metrics.get(name) for s in self.summaries])

    @property
    def accuracy(self) -> float:
        """The mean final accuracy over seeds; NaN when no seed has one."""
        value = self.metric(ACCURACY)
        return math.nan if value is None else value

    @property
    def speed_per_memory(self) -> float | None:
        return self.metric(SPEED)

    @property
    def adapters(self) -> str:
        """The plan's adapters (`LoRA r=16`), or FULL."""
        return (self.summaries[0].plan or {}).get("adapters") or FULL

    def seed_runs(self) -> list[SeedRun]:
        """What the ties read of each seed: its accuracy, its pair count and its eval_pairs.parquet."""
        runs = []
        for run, summary in zip(self.runs, self.summaries):
            accuracy = _mean([summary.metrics.get(ACCURACY)])
            runs.append(SeedRun(run, math.nan if accuracy is None else accuracy,
                                (summary.data or {}).get("eval_pairs") or None))
        return runs


def _config_key(summary: Summary) -> tuple[str, ...]:
    """Equal for the seeds of one config: its overrides without the seed."""
    return tuple(sorted(o for o in summary.overrides if override_key(o) != SEED))


def candidates_of(runs: Sequence[tuple[Path, SweepJob | None]]) -> list[Candidate]:
    """The completed ones of (run directory, its sweep point) grouped by config (seeds together), in the
    order first met."""
    groups: dict[tuple[str, ...], Candidate] = {}
    for run_dir, job in runs:
        summary = read_summary(run_dir)
        if summary is None or summary.status != Status.COMPLETED:
            continue
        candidate = groups.setdefault(_config_key(summary), Candidate([], [], job))
        candidate.runs.append(run_dir)
        candidate.summaries.append(summary)
    return list(groups.values())


def runs_of(outcomes: Sequence[Outcome]) -> list[tuple[Path, SweepJob]]:
    """A sweep's outcomes as candidates_of reads them: where each ran, and its point."""
    return [(o.run_dir, o.job) for o in outcomes]


@dataclass
class Decision:
    """The configs trained, each against the best on accuracy (the report's test), and the pick."""

    candidates: list[Candidate]
    decided_by: str = TRAINING_STAGE
    quality: QualityRanking | None = None
    tied: list[Candidate] = field(default_factory=list)  # best first
    pick: Candidate | None = None

    @classmethod
    def of(cls, candidates: list[Candidate], decided_by: str = TRAINING_STAGE) -> Decision:
        decision = cls(candidates, decided_by)
        if not candidates:
            return decision
        labels = [" ".join(c.overrides) or "(defaults)" for c in candidates]
        quality = compare_with_best([config_eval(label, c.seed_runs()) for label, c in zip(labels, candidates)])
        decision.quality = quality
        if quality.best is None:  # no config has a finite accuracy: nothing to recommend on
            return decision
        tied = [c for c, v in zip(candidates, quality.versus) if v.tied_with_best]
        decision.tied = sorted(tied, key=lambda c: -c.accuracy)
        decision.pick = max(decision.tied, key=lambda c: (c.speed_per_memory or 0.0, c.accuracy))
        return decision

    def versus(self, candidate: Candidate) -> VersusBest | None:
        return self.quality.versus[self.candidates.index(candidate)] if self.quality else None

    def _record(self, c: Candidate) -> dict:
        """A config's figures, as find_best.json writes them."""
        versus = self.versus(c)
        low, high = versus.accuracy_ci95 if versus else (math.nan, math.nan)
        return {
            "run": str(c.run_dir),
            "runs": [str(r) for r in c.runs],
            "overrides": c.overrides,
            "command": "python -m dpo_sweeps " + " ".join(shlex.quote(o) for o in c.overrides),
            ACCURACY: _finite(c.accuracy),
            "accuracy_ci95": [_finite(low), _finite(high)],
            SPEED: c.speed_per_memory,
            "perf/peak_memory_gib": c.metric("perf/peak_memory_gib"),
            "perf/tokens_per_s": c.metric("perf/tokens_per_s"),
        }

    def candidate_records(self) -> list[dict]:
        """Every config trained, against the best: tied or not, by how much, and how it was compared."""
        records = []
        for c in self.candidates:
            versus = self.versus(c)
            records.append({**self._record(c), "tied_with_best": bool(versus and versus.tied_with_best),
                            "rank_with_ties": versus.rank_with_ties if versus else None,
                            "diff_vs_best": _finite(versus.diff_vs_best) if versus else None,
                            "p_vs_best_adjusted": _finite(versus.p_vs_best_adjusted) if versus else None,
                            "compared_by": versus.method if versus else None})
        return records

    def recommendation(self) -> dict | None:
        """The fastest per GiB of the configs tied with the best accuracy; None when no config has one."""
        if self.pick is None:
            return None
        best = self.candidates[self.quality.best]
        return {**self._record(self.pick), "tied_with_best": [str(c.run_dir) for c in self.tied],
                "best_accuracy_run": str(best.run_dir), "decided_by": self.decided_by}


def recommend(candidates: list[Candidate], decided_by: str = TRAINING_STAGE) -> dict | None:
    """Of the configs tied with the best accuracy, the fastest per GiB (find_best.json's `recommendation`)."""
    return Decision.of(candidates, decided_by).recommendation()


def by_peft(candidates: list[Candidate], decided_by: str = TRAINING_STAGE) -> list[dict]:
    """The best config of each adapter setting (full fine-tune first), chosen as `recommend` chooses among
    that setting's configs."""
    kinds = sorted({c.adapters for c in candidates}, key=lambda k: (k != FULL, k))
    picks = [(kind, recommend([c for c in candidates if c.adapters == kind], decided_by)) for kind in kinds]
    return [{"adapters": kind, **pick} for kind, pick in picks if pick is not None]


def accuracy_text(rec: dict) -> str:
    """`0.912 [0.884, 0.937]`: the accuracy and its 95% interval, where there is one."""
    low, high = rec.get("accuracy_ci95") or (None, None)
    interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
    return f"{rec[ACCURACY]:.3f}{interval}"


def recommendation_text(result: dict) -> str:
    stages = result.get("stages") or {}
    cost = ", ".join(f"{name} {device_time_text(stage.get('device_seconds'))}" for name, stage in stages.items()
                     if "device_seconds" in stage)
    rec = result.get("recommendation")
    if rec is None:
        return ("find_best: no training run completed with a finite preference accuracy, so there is no "
                "recommendation (see the runs above).")
    speed = rec.get(SPEED)
    seeds = len(rec["runs"])
    lines = [
        "===== recommendation =====",
        f"accuracy {accuracy_text(rec)}" + (f" over {seeds} seeds" if seeds > 1 else "")
        + (f", {speed:,.0f} tokens/s per GiB" if isinstance(speed, (int, float)) else "")
        + f"  (the fastest per GiB of {len(rec['tied_with_best'])} config(s) tied with the best accuracy; "
        + f"decided by the {rec['decided_by']})",
        f"run      {rec['run']}",
        f"train it {rec['command']}",
        f"cost     {cost}",
    ]
    if len(result.get("by_peft") or []) > 1:
        lines.append("best of each: " + "; ".join(f"{b['adapters']} {accuracy_text(b)}" for b in result["by_peft"]))
    return "\n".join(lines)
