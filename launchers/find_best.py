"""`+sweep=find_best`: which config should I train with? A staged search that ends in one command.

Settings come in two kinds: the parallel plan (sharding, precision, micro-batch, activation
checkpointing) decides speed and memory; the algorithm (beta, learning rate, loss) decides accuracy.
So instead of training every combination of both, the grid sweeper, given `hydra.sweeper.stages`:
1. checks that every plan fits its device (dpo_sweeps/parallel/fit.py: `resources.device_memory_gib`); the
   ones that would not are recorded as skipped, kind oom_predicted, and never start;
2. probes every plan (`probe.steps`: a few steps for speed and memory only) into `<sweep>/probes/`;
3. fully trains every algorithm setting on the `top_k` plans with the best speed per memory, into
   `<sweep>/train/`. A plan setting under `peft` (full fine-tune or adapters, their rank) changes what
   is learned as well as speed and memory, so it is not chosen on speed alone: the best plan of every
   such variant probed (`peft=none` and `peft=lora`, say) is trained too, beside the `top_k`;
4. recommends one config: of the configs tied with the best final preference accuracy (not significantly
   worse on the held-out pairs they share, dpo_sweeps/ranking/ties.py: the report's own test), the
   fastest per GiB; prints the command that trains it and writes `<sweep>/find_best.json`, which the
   report opens with, with the best of each peft variant side by side (`by_peft`);
5. with `replicates: K` (K >= 2) and more than one config tied after stage 3: trains K-1 more seeds of
   each tied config into `<sweep>/replicates/`, and decides again on every seed (per held-out pair, the
   seed means; the variance a seed shares across all pairs added to the test). find_best.json's `decided_by` says which stage decided. The decision and its
   records are launchers/find_best_answer.py's.
With a cluster named (`cluster=`), a stage 0 comes first: the plans are ranked by predicted speed per
memory and only those within `predict_keep` of the best, plus the best of each strategy, are probed
(launchers/predicted_plans.py); find_best.json and the report list the others and why.
Running the same command again skips what completed, as any grid sweep does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpo_sweeps.launchers.find_best_answer import (
    SEED,
    SPEED,
    Candidate,
    Decision,
    by_peft,
    candidates_of,
    recommendation_text,
    runs_of,
)
from dpo_sweeps.launchers.jobs import SweepJob, override_key, write_multirun_yaml
from dpo_sweeps.launchers.outcome import Outcome, sweep_cost, sweep_screen
from dpo_sweeps.launchers.preflight import (
    InvalidSweep,
    compose_and_check,
    refusal_message,
)
from dpo_sweeps.rundir.atomic import write_json_atomic
from dpo_sweeps.rundir.paths import FIND_BEST
from dpo_sweeps.rundir.summary import Status, read_summary

log = logging.getLogger("launchers")


def learns(override: str) -> bool:
    """Whether a plan setting changes what is learned, not only speed and memory: peft and its keys."""
    key = override_key(override)
    return key == "peft" or key.startswith("peft.")


@dataclass
class Stages:
    """hydra.sweeper.stages: the two kinds of settings, as swept values ({key: "a,b"})."""

    systems: dict[str, str]
    algorithm: dict[str, str]
    probe_steps: int = 10
    top_k: int = 2
    # Each probe's probe.max_seconds: a plan far slower than the rest (bf16 on a CPU without bf16 kernels,
    # say) is stopped after one timed step past this many seconds instead of running all probe_steps.
    probe_max_seconds: float | None = None
    # Stage 0 (with cluster=): probe only the plans predicted within this factor of the best speed per memory.
    predict_keep: float = 1.5
    # Seeds per config tied with the best after stage 3 (K - 1 more are trained); 0 or 1: none.
    replicates: int = 0

    @classmethod
    def of(cls, raw: Any) -> Stages:
        raw = dict(raw)
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise InvalidSweep(f"hydra.sweeper.stages.{unknown[0]}: not a setting of the staged search "
                               "(accepted: systems, algorithm, probe_steps, top_k, probe_max_seconds, predict_keep, "
                               "replicates)")
        keep = raw.get("predict_keep", cls.__dataclass_fields__["predict_keep"].default)
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not keep >= 1:
            raise InvalidSweep(f"hydra.sweeper.stages.predict_keep: got {keep!r} (accepted: a factor >= 1, e.g. 1.5)")
        for key in ("systems", "algorithm"):
            if not raw.get(key) or not hasattr(raw[key], "items"):
                raise InvalidSweep(f"hydra.sweeper.stages.{key}: got {raw.get(key)!r} (accepted: a mapping of "
                                   "setting to swept values, e.g. {fsdp: 'full_shard,shard_grad_op'})")
        for key in ("probe_steps", "top_k"):
            value = raw.get(key, cls.__dataclass_fields__[key].default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidSweep(f"hydra.sweeper.stages.{key}: got {value!r} (accepted: an integer >= 1)")
        replicates = raw.get("replicates", cls.__dataclass_fields__["replicates"].default)
        if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 0:
            raise InvalidSweep(f"hydra.sweeper.stages.replicates: got {replicates!r} (accepted: an integer >= 0, the "
                               "seeds each config tied with the best trains; 0 or 1: no replicates stage)")
        seconds = raw.get("probe_max_seconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not seconds > 0):
            raise InvalidSweep(f"hydra.sweeper.stages.probe_max_seconds: got {seconds!r} "
                               "(accepted: null, for no limit, or a number of seconds > 0)")
        return cls(systems={str(k): str(v) for k, v in raw["systems"].items()},
                   algorithm={str(k): str(v) for k, v in raw["algorithm"].items()},
                   probe_steps=raw.get("probe_steps", 10), top_k=raw.get("top_k", 2), probe_max_seconds=seconds,
                   predict_keep=float(keep), replicates=replicates)

    def probe_overrides(self) -> list[str]:
        """What makes a point a probe of its plan."""
        limit = [] if self.probe_max_seconds is None else [f"probe.max_seconds={self.probe_max_seconds}"]
        return [f"probe.steps={self.probe_steps}", *limit]


def _sweep_values(settings: dict[str, str]) -> list[str]:
    return [f"{key}={values}" for key, values in settings.items()]


def _subdir(stage: str) -> str:
    return f"hydra.sweep.subdir={stage}/${{hydra.job.num}}"


class FindBest:
    def __init__(self, sweeper: Any, stages: Stages):
        self.sweeper = sweeper
        self.stages = stages
        self.sweep_dir = Path(str(sweeper.config.hydra.sweep.dir))
        self.outcomes: list[Outcome] = []
        self.not_probed: list[dict] = []  # stage 0: the plans predicted too slow per memory to probe

    # ------------------------------------------------------------------ the stages
    def run(self, arguments: Sequence[str]) -> list[Outcome]:
        base = list(arguments)
        probes = self._compose("probes", self.sweeper.grid(
            base + _sweep_values(self.stages.systems) + self.stages.probe_overrides() + [_subdir("probes")]), 0)
        # Every algorithm setting is checked before anything runs too, on the first plan.
        first_plan = self._plan_of(probes[0])
        self._compose("train", self.sweeper.grid(base + first_plan + _sweep_values(self.stages.algorithm)
                                                 + [_subdir("train")]), len(probes), check_only=True)
        probes = self._stage_zero(probes)
        if self.sweeper.dry_run:
            print(f"dry run: {len(probes)} probes of the parallel plan into {self.sweep_dir}/probes, then "
                  f"{self._algorithm_points()} algorithm settings on each of the best {self.stages.top_k} plans"
                  f"{self._variants_text(probes)} into {self.sweep_dir}/train{self._replicates_text()} (none was started)")
            return []
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        write_multirun_yaml(self.sweep_dir, self.sweeper.config)

        probe_outcomes = self._run_stage(probes, "probes")
        best_plans = self._best_plans(probe_outcomes)
        log.info("stage 3: the %d plans with the best speed per memory (and of each peft variant): %s", len(best_plans),
                 "; ".join(" ".join(p) for p in best_plans))
        train_points = [point for plan in best_plans for point in self.sweeper.grid(
            base + plan + _sweep_values(self.stages.algorithm) + [_subdir("train")])]
        train = self._compose("train", train_points, len(probes))
        train_outcomes = self._run_stage(train, "train")
        decision = Decision.of(candidates_of(runs_of(train_outcomes)))
        replicate_outcomes: list[Outcome] = []
        if self.stages.replicates > 1 and len(decision.tied) > 1:
            replicate_outcomes = self._run_stage(self._replicates(decision.tied, len(probes) + len(train)), "replicates")
            decision = Decision.of(candidates_of(runs_of(train_outcomes + replicate_outcomes)),
                                   f"replicates stage, {self.stages.replicates} seeds")
        result = self._write_result(probe_outcomes, train_outcomes, replicate_outcomes, best_plans, decision)
        print(sweep_screen(self.sweep_dir, self.outcomes, title="find_best sweep"), flush=True)
        print(recommendation_text(result), flush=True)
        return self.outcomes

    def _replicates(self, tied: list[Candidate], first_num: int) -> list[SweepJob]:
        """Stage 4: K-1 more seeds of every tied config, after its first seed. The points are the same on a
        rerun (stage 3's runs are reused, so the same configs are tied), so completed replicates are reused."""
        points = []
        for candidate in tied:
            first = candidate.first_seed
            kept = [o for o in candidate.job.overrides if override_key(o) not in (SEED, "hydra.sweep.subdir")]
            points += [[*kept, f"{SEED}={first + extra}", _subdir("replicates")]
                       for extra in range(1, self.stages.replicates)]
        log.info("stage 4: %d configs tied with the best; %d more seed(s) of each", len(tied), self.stages.replicates - 1)
        return self._compose("replicates", points, first_num)

    def _stage_zero(self, probes: list[SweepJob]) -> list[SweepJob]:
        """With a cluster named: the plans worth probing, by predicted speed per memory (predicted_plans.py)."""
        if not probes or not probes[0].task_config.get("cluster"):
            return probes
        from dpo_sweeps.launchers.predicted_plans import keep_plans, predict_plans

        kept, dropped = keep_plans(predict_plans(probes), self.stages.predict_keep)
        self.not_probed = [p.as_dict(reason) for p, reason in dropped]
        print(f"stage 0: {len(kept)} of {len(probes)} plans predicted within {self.stages.predict_keep:g}x of the best "
              "speed per memory (or the best of their strategy) are probed", flush=True)
        for p in kept:
            print(f"  probe      {' '.join(self._plan_of(p.job))}: {p.prediction.text()}", flush=True)
        for p, reason in dropped:
            print(f"  not probed {' '.join(self._plan_of(p.job))}: {reason}", flush=True)
        return [p.job for p in kept]

    def _replicates_text(self) -> str:
        if self.stages.replicates < 2:
            return ""
        return (f", then, if more than one config is tied with the best, {self.stages.replicates - 1} more seed(s) of each "
                f"tied config into {self.sweep_dir}/replicates")

    def _variants_text(self, probes: list[SweepJob]) -> str:
        variants = {tuple(o for o in self._plan_of(job) if learns(o)) for job in probes}
        return f" and the best plan of each of the {len(variants)} peft variants" if len(variants) > 1 else ""

    def _algorithm_points(self) -> int:
        return len(self.sweeper.grid(_sweep_values(self.stages.algorithm)))

    def _compose(self, stage: str, points: list[list[str]], first_num: int, check_only: bool = False) -> list[SweepJob]:
        jobs, invalid = compose_and_check(self.sweeper.hydra_context, self.sweeper.config, points, first_num,
                                          self.sweeper.launcher)
        if invalid:
            raise InvalidSweep(f"stage '{stage}': " + refusal_message(invalid, points))
        return jobs

    def _plan_of(self, job: SweepJob) -> list[str]:
        """The systems overrides of a point: what its parallel plan is."""
        return [o for o in job.overrides if override_key(o) in self.stages.systems]

    def _run_stage(self, jobs: list[SweepJob], stage: str) -> list[Outcome]:
        """Launch a stage's jobs; on the local launcher its forecast line comes first, the stage's alone: the
        next stage's runs are not known until this one has run (stage 3's plans are the probes' best, how many
        of them depends on which probes completed and on their peft variants; stage 4 runs only on a tie)."""
        outcomes, _ = self.sweeper.launch_pending(*self.sweeper.to_launch(jobs, self.sweep_dir), stage=stage)
        self.outcomes += outcomes
        return outcomes

    def _best_plans(self, probe_outcomes: list[Outcome]) -> list[list[str]]:
        measured = []
        for o in probe_outcomes:
            summary = read_summary(o.run_dir)
            speed = summary.metrics.get(SPEED) if summary is not None else None
            if summary is not None and summary.status == Status.COMPLETED and isinstance(speed, (int, float)):
                measured.append((speed, self._plan_of(o.job)))
        if not measured:
            raise InvalidSweep(f"stage 'probes': no probe completed, so no plan can be chosen (see {self.sweep_dir}/probes)")
        measured.sort(key=lambda m: -m[0])
        best = [plan for _, plan in measured[: self.stages.top_k]]
        # The fastest plan of each peft variant too: speed per memory cannot weigh what it learns.
        variants = {tuple(o for o in plan if learns(o)) for plan in best}
        for _, plan in measured:
            variant = tuple(o for o in plan if learns(o))
            if variant not in variants:
                variants.add(variant)
                best.append(plan)
        return best

    # ------------------------------------------------------------------ the answer
    def _write_result(self, probes: list[Outcome], train: list[Outcome], replicates: list[Outcome],
                      plans: list[list[str]], decision: Decision) -> dict:
        probe_cost, probe_saved = sweep_cost(probes)
        train_cost, _ = sweep_cost(train)
        result = {
            "stages": {
                "probes": {"runs": len(probes), "completed": sum(o.status in ("completed", "reused") for o in probes),
                           "skipped_oom_predicted": sum(o.status == "skipped" for o in probes),
                           "device_seconds": probe_cost, "saved_by_fit_check_device_seconds": probe_saved["fit_check"]},
                "train": {"runs": len(train), "completed": sum(o.status in ("completed", "reused") for o in train),
                          "plans": [" ".join(p) for p in plans], "device_seconds": train_cost},
            },
            "decided_by": decision.decided_by,
            "recommendation": decision.recommendation(),
            "candidates": decision.candidate_records(),
            "by_peft": by_peft(decision.candidates, decision.decided_by),
        }
        if self.stages.replicates > 1:
            result["stages"]["replicates"] = {
                "seeds": self.stages.replicates, "runs": len(replicates),
                "completed": sum(o.status in ("completed", "reused") for o in replicates),
                "device_seconds": sweep_cost(replicates)[0]}
        if self.not_probed:
            result["stages"]["predicted"] = {"predict_keep": self.stages.predict_keep, "not_probed": self.not_probed}
        write_json_atomic(self.sweep_dir / FIND_BEST, result)
        return result
