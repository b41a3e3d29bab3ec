"""Each loss's own metrics: what a run's summary holds beyond the metrics every loss logs.

ORPO's orpo/log_odds_ratio, SimPO's simpo/margin_minus_gamma, IPO's ipo/gap, a mix's mix/<term>,
the RPO term's nll_loss (INTERFACE.md lists them). Read from summary.json's eval/* metrics, so a
loss added later shows here without a change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpo_sweeps.analysis.ranking import Ranking, Stat

# Logged by every loss: the loss itself, rewards/* and logps/* (the ranking's own columns), and the
# zero-shot baseline and the trained policy's own preference (train.zero_shot_eval).
SHARED = ("eval/loss",)
SHARED_PREFIXES = ("eval/rewards/", "eval/logps/", "eval/zero_shot/", "eval/policy/")


def own_metric_names(metrics: dict[str, Any]) -> list[str]:
    return [k for k in metrics if k.startswith("eval/") and k not in SHARED and not k.startswith(SHARED_PREFIXES)]


@dataclass
class LossMetric:
    config: str  # the config's label in the ranking
    loss: str  # loss.name
    metric: str  # e.g. eval/orpo/log_odds_ratio
    stat: Stat  # over the config's completed seeds


def loss_metric_rows(ranking: Ranking) -> list[LossMetric]:
    """One row per (config, own metric), in ranking order; configs without completed runs have none."""
    rows = []
    for config in ranking.configs:
        completed = config.completed
        if not completed:
            continue
        names = dict.fromkeys(name for run in completed for name in own_metric_names(run.metrics))
        for name in names:
            values = [run.metrics[name] for run in completed if isinstance(run.metrics.get(name), (int, float))]
            stat = Stat.of(values)
            if stat is not None:
                rows.append(LossMetric(config.label, str(completed[0].config.get("loss.name")), name, stat))
    return rows
