"""summary.json's metrics at the end of a run: the last train and eval values, the zero-shot baseline
with the final accuracy's interval, perf reduced over ranks, and the memory estimate beside the peak."""

from __future__ import annotations

from typing import Any

import torch

from dpo_sweeps.config.schema import Config
from dpo_sweeps.cost.predict import predicted_step_metrics
from dpo_sweeps.parallel.allocator import allocator_in_use
from dpo_sweeps.parallel.memory_estimate import MemoryEstimate, estimate_peak_memory, run_shape_of
from dpo_sweeps.parallel.mfu import device_peak_flops
from dpo_sweeps.parallel.plan import ParallelPlan
from dpo_sweeps.train.perf import GIB, PerfMeter
from dpo_sweeps.train.setup import TrainingSetup
from dpo_sweeps.train.state import TrainState
from dpo_sweeps.train.zero_shot import accuracy_interval


def final_metrics(cfg: Config, plan: ParallelPlan, built: TrainingSetup, state: TrainState, perf: PerfMeter, *,
                  device: torch.device, world_size: int, probing: bool, is_main: bool = True) -> dict[str, Any]:
    """summary.json metrics: last train and eval values, and perf reduced over ranks (collective). The predicted
    step only on rank 0 (`is_main`), the rank that writes summary.json: it reads and tokenizes a sample of the data."""
    peak, no_peak = device_peak_flops(device, plan.compute)
    perf_metrics = perf.summary(world_size=world_size, peak_flops=peak, mfu_reason=no_peak)
    metrics: dict[str, Any] = {}
    if probing:
        # A probe's losses and rewards are against placeholder reference log-probs, after a few
        # steps: they say nothing of the config's preference accuracy, so the summary leaves them out.
        metrics["probe/steps"] = state.step
        metrics["probe/stopped_at_max_seconds"] = state.step < cfg.train.max_steps
    else:
        metrics.update({k: v for k, v in state.last_eval.items() if k != "step"})
        metrics.update(state.zero_shot)
        if state.zero_shot:  # the final accuracy's interval, to compare with the baseline's
            metrics.update(accuracy_interval(metrics, len(built.eval_pairs)))
        metrics["train/loss"] = state.last_train.get("train/loss")
        metrics["train/rewards/accuracies"] = state.last_train.get("train/rewards/accuracies")
    metrics.update(perf_metrics)
    if built.reference_precompute_s is not None:  # one-time cost, outside the timed steps
        metrics["perf/reference_precompute_s"] = built.reference_precompute_s
    estimate = memory_estimate(cfg, plan, built)
    metrics["perf/peak_memory_estimate_gib"] = estimate.total / GIB
    if built.rss_before_model:  # CPU: what the estimate starts from, the process's own memory before its model,
        # and the runtime it adds to it (none when this process trained before: a probe batch's later runs)
        metrics["perf/memory_before_model_gib"] = built.rss_before_model / GIB
        metrics["perf/peak_memory_estimate_runtime_gib"] = (estimate.baseline - built.rss_before_model) / GIB
    if is_main:
        metrics.update(predicted_step_metrics(cfg, world_size, device, built.shape, perf_metrics.get("perf/step_time_s")))
    metrics.update({"steps": state.step, "world_size": world_size, "num_params": built.num_params})
    if built.scaler.enabled:
        metrics["train/skipped_steps"] = built.scaler.skipped_steps
    return metrics


def memory_estimate(cfg: Config, plan: ParallelPlan, built: TrainingSetup) -> MemoryEstimate:
    """memory_estimate.py's peak for this run's shape (compare perf/peak_memory_gib)."""
    run = run_shape_of(cfg, plan, seq_len=built.longest_row, response_fraction=built.response_fraction,
                       allocator=allocator_in_use())
    return estimate_peak_memory(built.shape, run, baseline_bytes=built.rss_before_model,
                                runtime_resident=built.runtime_resident)
