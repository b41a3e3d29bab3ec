"""dpo_sweeps.api.compose: the config `python -m dpo_sweeps OVERRIDES` runs, refusals in one line."""

from __future__ import annotations

import pytest

from dpo_sweeps import api
from dpo_sweeps.errors import InvalidConfig, RunFailure


def test_compose_applies_the_overrides_the_command_takes():
    cfg = api.compose(["loss=ipo", "loss.beta=0.5", "resources.nproc_per_node=2"], run_dir="outputs/ipo")
    assert cfg.loss.name == "ipo" and cfg.loss.beta == 0.5 and cfg.resources.nproc_per_node == 2
    assert cfg.hydra.run.dir == "outputs/ipo"
    assert list(cfg.hydra.overrides.task) == ["loss=ipo", "loss.beta=0.5", "resources.nproc_per_node=2"]


def test_compose_refuses_a_key_or_option_in_one_line_naming_it():
    with pytest.raises(InvalidConfig) as unknown:
        api.compose(["train.lr_rate=1"])
    assert str(unknown.value).startswith("train.lr_rate: not a setting (accepted: train has batch_size,")
    with pytest.raises(RunFailure) as option:
        api.compose(["data=hhh"])
    assert option.value.kind == "invalid_config" and "\n" not in str(option.value)
    assert str(option.value).startswith("data: no option 'hhh' in conf/data (accepted: did you mean data=hh?")
