"""train.lr_schedule: the learning rate of every step, against transformers' schedulers of the same names."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from dpo_sweeps.config.schema import LR_SCHEDULES, Config, TrainConfig
from dpo_sweeps.train.setup import build_scheduler

THEIRS = {"constant": get_constant_schedule_with_warmup, "linear": get_linear_schedule_with_warmup,
          "cosine": get_cosine_schedule_with_warmup}


def _lrs(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    """The learning rate each optimizer step runs with, as the trainer logs it (train/lr)."""
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return lrs


def _train_config(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return Config.of(OmegaConf.to_container(cfg, resolve=True)).train


def _optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)


@pytest.mark.parametrize("schedule", LR_SCHEDULES)  # every schedule the schema accepts
def test_after_the_warmup_each_schedule_is_transformers_own(schedule):
    warmup, steps, lr = 4, 20, 1e-3
    train = _train_config(f"train.lr_schedule={schedule}", f"train.warmup_steps={warmup}",
                          f"train.max_steps={steps}", f"train.lr={lr}")
    ours = _lrs(build_scheduler(_optimizer(lr), train), steps)
    kwargs = {} if schedule == "constant" else {"num_training_steps": steps}
    theirs = _lrs(THEIRS[schedule](_optimizer(lr), num_warmup_steps=warmup, **kwargs), steps)
    assert ours[warmup:] == pytest.approx(theirs[warmup:], rel=1e-12)
    # The warm-up's first step already moves the model (lr / (warmup + 1)); transformers' first is 0.
    assert ours[:warmup + 1] == pytest.approx([lr * (s + 1) / (warmup + 1) for s in range(warmup + 1)])
    if schedule != "constant":  # down from lr after the warm-up, never to 0 on a step that trains
        assert ours[warmup:] == sorted(ours[warmup:], reverse=True) and ours[-1] > 0
    if schedule == "linear":
        assert ours[-1] == pytest.approx(lr / (steps - warmup))


def test_the_default_schedule_is_constant_after_the_warmup():
    assert _train_config().lr_schedule == "constant"
