"""A forward pass beats the watchdog at every transformer block (train/trainer.py _beat_in_every_block): one
pass over a large held-out batch may outlast resources.hang_timeout_s on a loaded CPU, and a pass that
moves is not a hang."""

from __future__ import annotations

import torch

from dpo_sweeps import api
from dpo_sweeps.config.schema import Config
from dpo_sweeps.models.build import build_policy, build_tokenizer
from dpo_sweeps.train.trainer import Trainer


def test_each_block_of_a_forward_beats_with_the_phase_last_reported():
    from omegaconf import OmegaConf

    composed = OmegaConf.to_container(api.compose(["model=tiny_llama", "model.from_config.num_hidden_layers=3"]))
    composed.pop("hydra")
    cfg = Config.of(OmegaConf.to_container(OmegaConf.create(composed), resolve=True))
    model = build_policy(cfg.model, build_tokenizer(cfg.model, ["a b c"]), seed=0)
    beats: list[tuple[int, str]] = []
    trainer = Trainer.__new__(Trainer)  # the hook placement alone: no run, no process group
    trainer.cfg, trainer._beat, trainer._last_beat = cfg, lambda step, phase: beats.append((step, phase)), (0, "x")
    trainer._beat_in_every_block(model)
    trainer.heartbeat(7, "eval")
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    assert beats == [(7, "eval")] * 4  # the phase reported, then once per block
