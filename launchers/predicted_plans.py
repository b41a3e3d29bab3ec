"""Stage 0 of the staged search (launchers/find_best.py), with a cluster named (`cluster=`): rank the
plans by predicted speed per memory (dpo_sweeps/cost/: tokens/s per device over the fit check's peak
estimate) before probing any, and probe only those within `predict_keep` of the best, plus the best of
each sharding strategy (the prediction's least certain part is the communication a strategy decides)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpo_sweeps.launchers.jobs import SweepJob
from dpo_sweeps.launchers.preflight import CheckedConfig


@dataclass
class PredictedPlan:
    job: SweepJob
    strategy: str
    speed_per_memory: float  # predicted tokens/s per device per GiB of estimated peak
    prediction: Any

    def as_dict(self, reason: str | None = None) -> dict:
        return {"overrides": list(self.job.overrides), "strategy": self.strategy,
                "predicted_speed_per_memory": self.speed_per_memory,
                "predicted": self.prediction.text(), **({"reason": reason} if reason else {})}


def predict_plans(jobs: list[SweepJob]) -> list[PredictedPlan]:
    from dpo_sweeps.cost.predict import predict_config, profile_of_config
    from dpo_sweeps.parallel.fit import predicted_peak_gib

    checked = CheckedConfig()
    out = []
    for job in jobs:
        cfg = checked.of(job.task_config)
        peak = predicted_peak_gib(cfg, job.world_size)
        prediction = predict_config(cfg, profile_of_config(cfg), job.world_size, peak)
        out.append(PredictedPlan(job, cfg.fsdp.sharding_strategy,
                                 prediction.tokens_per_s_per_device.value / max(peak, 1e-9), prediction))
    return out


def keep_plans(plans: list[PredictedPlan], keep: float) -> tuple[list[PredictedPlan], list[tuple[PredictedPlan, str]]]:
    """The plans to probe, and the others with why each is not probed."""
    best = max(p.speed_per_memory for p in plans)
    best_of_strategy = {}
    for p in plans:
        if p.strategy not in best_of_strategy or p.speed_per_memory > best_of_strategy[p.strategy].speed_per_memory:
            best_of_strategy[p.strategy] = p
    kept, dropped = [], []
    for p in plans:
        if p.speed_per_memory * keep >= best or best_of_strategy[p.strategy] is p:
            kept.append(p)
        else:
            dropped.append((p, f"predicted {p.speed_per_memory:,.0f} tokens/s per GiB, more than {keep:g}x below the "
                               f"best plan's {best:,.0f}, and not the best {p.strategy} plan"))
    return kept, dropped
