"""parallel/fit.py's estimator process: a single run ends it once its forecast is printed, so that a process
holding a rank's imports does not live as long as the run; a later question starts another."""

from __future__ import annotations

import os

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.config.schema import Config
from dpo_sweeps.parallel import fit


def test_stop_measuring_ends_the_process_and_a_later_question_starts_another():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = Config.of(OmegaConf.to_container(compose("config"), resolve=True))
    key = fit.architecture_key(cfg.model)
    estimator = fit._estimator
    first = estimator.model_shape(key)
    assert first is not None and "shape" in first
    pid = estimator.proc.pid
    fit.stop_measuring()
    assert estimator.proc is None and not os.path.exists(f"/proc/{pid}")
    estimator.replies.pop(key)  # asked again, it must be answered by a new process, its baseline read first
    assert estimator.model_shape(key) == first and estimator.proc.pid != pid and estimator.baseline > 0
    fit.stop_measuring()
