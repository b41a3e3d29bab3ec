"""The fit check runs once per distinct estimate: the settings `fit_key` leaves out never change it."""

from __future__ import annotations

import copy

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.config.schema import Config
from dpo_sweeps.parallel.fit import NOT_ESTIMATED, check_fit, fit_key


def test_the_settings_fit_key_leaves_out_do_not_change_the_fit_check():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", ["resources.device_memory_gib=10", "resources.device=cpu"])
    base = OmegaConf.to_container(cfg, resolve=True)
    expected = check_fit(Config.of(base), 1)
    assert expected is not None
    changed_keys = 0
    for section, keys in NOT_ESTIMATED.items():
        for key in keys if keys is not None else base[section]:
            for value in (None, 0, 12345, True, "changed"):
                varied = copy.deepcopy(base)
                varied[section][key] = value
                assert fit_key(varied, 1) == fit_key(base, 1)
                assert check_fit(Config.of(varied), 1) == expected, f"{section}.{key}={value!r}"
            changed_keys += 1
    assert changed_keys > 10
    # ... while a setting the estimate reads makes another key, and another estimate
    bigger = copy.deepcopy(base)
    bigger["train"]["micro_batch_size"] *= 4
    assert fit_key(bigger, 1) != fit_key(base, 1)
    assert check_fit(Config.of(bigger), 1).estimate_gib > expected.estimate_gib
