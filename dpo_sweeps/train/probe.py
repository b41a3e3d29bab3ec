"""Probe mode: a few steps of a config, for its steady-state speed and peak memory only.

    python -m dpo_sweeps probe.steps=8 fsdp=shard_grad_op precision=bf16 resources.nproc_per_node=2
    python -m dpo_sweeps -m +sweep=quickstart probe.steps=8 hydra.sweep.dir=multirun/quickstart-probe

A sweep can rank configs by speed per memory (`perf/speed_per_memory` in summary.json, the same
metrics as a full run) before, or instead of, training them all. A probe run trains `probe.steps`
steps exactly as the full run would (same sharding, precision, batches, techniques), the first
`perf.warmup_steps` of them untimed, then stops: no periodic evaluation, one held-out micro-batch
per rank at the end, no model saved, no checkpoints. Two things are skipped because they cannot
change speed or memory: the reference model's one-time scoring pass (with
`train.precompute_reference_logps`, the probe's pairs carry zeros instead), and everything after
the last probe step. The summary's `perf/peak_memory_estimate_gib` is the estimate of
memory_estimate.py for the same config, for comparison; `probe/steps` marks a probe, and its eval/*
and train/* values are null (losses against placeholder reference log-probs after a few steps say
nothing of the config's accuracy), so analysis/report.py ranks a probe sweep by speed per memory
only. bench/probe_vs_full.py compares the probes' ranking of the quickstart grid with full runs'.
"""

from __future__ import annotations

from dataclasses import replace

from dpo_sweeps.config.schema import Config


def is_probe(cfg: Config) -> bool:
    return cfg.probe.steps > 0


def probe_config(cfg: Config, world_size: int) -> Config:
    """The config a probe trains with, derived from `cfg` (which stays as it was resolved: summary.json
    records it); `cfg` itself when probe.steps is 0. probe.steps was checked by checks/validate.py (>= 0,
    and more than perf.warmup_steps when set)."""
    if not is_probe(cfg):
        return cfg
    # One held-out pass per rank, of the size the full run's passes take at most when it is set (its memory
    # may pass training's); the derived size fits in a training micro-batch's memory (memory_estimate.py).
    eval_pairs = cfg.train.eval_micro_batch_size or cfg.train.micro_batch_size
    train = replace(cfg.train, max_steps=cfg.probe.steps, eval_every=0, save_model=False,
                    eval_max_pairs=eval_pairs * world_size)
    return replace(cfg, train=train, checkpoint=replace(cfg.checkpoint, every_steps=0))
