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


def test_a_command_that_started_the_estimator_leaves_no_process_behind():
    # The estimator ends at end of input when the command exits, but its teardown takes a moment: the
    # command waits for it, or a sweep's end finds a process of its own still running (the load test did).
    import subprocess
    import sys

    code = ("from dpo_sweeps.parallel.fit import _estimator, rank_baseline_bytes; rank_baseline_bytes(); "
            "print(_estimator.proc.pid, flush=True)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    pid = int(done.stdout.split()[-1])
    try:
        state = open(f"/proc/{pid}/stat").read().split()[2]
    except OSError:
        state = "gone"
    assert state in ("gone", "Z"), f"the estimator process {pid} outlived its command (state {state})"
