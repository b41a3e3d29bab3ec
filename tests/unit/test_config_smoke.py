"""DPO_SWEEPS_SMOKE=1 (dpo_sweeps/config/smoke.py): the typed config of every run trains 2 steps on at most 8
held-out pairs; without it, the config is as composed."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from dpo_sweeps import api
from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import InvalidConfig


def typed(overrides: list[str]) -> Config:
    cfg = api.compose(overrides)
    return Config.of({key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
                      for key in cfg if key != "hydra"})


def test_smoke_cuts_steps_and_eval_pairs_of_the_typed_config(monkeypatch):
    monkeypatch.setenv("DPO_SWEEPS_SMOKE", "1")
    cut = typed(["train.max_steps=20", "train.eval_max_pairs=null"])
    assert (cut.train.max_steps, cut.train.eval_max_pairs) == (2, 8)
    assert typed(["train.max_steps=1", "train.eval_max_pairs=4"]).train.max_steps == 1  # smaller values stay
    assert typed(["train.max_steps=1", "train.eval_max_pairs=4"]).train.eval_max_pairs == 4
    assert cut.train.lr == typed([]).train.lr  # nothing else changes


def test_without_smoke_the_config_is_as_composed(monkeypatch):
    monkeypatch.delenv("DPO_SWEEPS_SMOKE", raising=False)
    assert typed(["train.max_steps=20"]).train.max_steps == 20
    monkeypatch.setenv("DPO_SWEEPS_SMOKE", "0")
    assert typed(["train.max_steps=20", "train.eval_max_pairs=100"]).train.eval_max_pairs == 100


def test_a_smoke_value_it_does_not_know_is_refused(monkeypatch):
    monkeypatch.setenv("DPO_SWEEPS_SMOKE", "yes")
    with pytest.raises(InvalidConfig, match="DPO_SWEEPS_SMOKE: got 'yes' .accepted: 1"):
        typed([])
