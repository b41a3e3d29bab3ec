"""config_hash: what defines a run, and hashes that stay valid for sweep directories written before the
typed schema (which gave every precision preset its loss-scale keys)."""

from __future__ import annotations

import copy

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.rundir.hashing import config_hash


def _composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


def test_a_config_written_before_the_schema_hashes_as_it_does_now():
    now = _composed("precision=bf16")
    assert "initial_loss_scale" in now["precision"]
    before = copy.deepcopy(now)
    del before["precision"]["initial_loss_scale"], before["precision"]["loss_scale_growth_interval"]
    assert config_hash(before) == config_hash(now)


def test_a_run_written_before_a_setting_existed_keeps_its_hash_at_that_settings_old_behaviour():
    now = _composed()
    assert now["train"]["lr_schedule"] == "constant"  # how every run trained before the setting
    before = copy.deepcopy(now)
    del before["train"]["lr_schedule"]
    assert config_hash(before) == config_hash(now)
    assert config_hash(_composed("train.lr_schedule=linear")) != config_hash(now)


def test_settings_that_change_the_run_change_its_hash():
    fp16 = _composed("precision=fp16")
    assert fp16["precision"]["loss_scaling"]
    other_scale = copy.deepcopy(fp16)
    other_scale["precision"]["loss_scale_growth_interval"] += 1  # acts under loss scaling
    other_norm = copy.deepcopy(fp16)
    other_norm["train"]["max_grad_norm"] += 0.5
    hashes = {config_hash(c) for c in (fp16, other_scale, other_norm, _composed("precision=bf16"))}
    assert len(hashes) == 4
