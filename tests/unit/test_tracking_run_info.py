"""What every tracker is told about a run (dpo_sweeps/tracking/run_info.py), and settings of a tracker
that is not chosen refused (checks/unused.py)."""

from __future__ import annotations

import json
import os

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.checks.unused import Launch, check_settings_used
from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.tracking.run_info import RunInfo, flatten


def test_a_sweeps_trial_is_tagged_with_its_sweep_stage_trial_and_plan_and_secrets_are_redacted(tmp_path):
    run_dir = tmp_path / "optuna_dpo" / "3"
    run_dir.mkdir(parents=True)
    (run_dir / "trial.json").write_text(json.dumps({"trial_number": 3, "study_name": "s"}))
    config = {"probe": {"steps": 0}, "model": {"hf_token": "hf-abcdef123456", "tokenizer": {"kind": "byte"}},
              "loss": {"beta": 0.1}}
    run = RunInfo.of(Config.of(config), run_dir=run_dir, name="optuna_dpo/3", group="optuna_dpo",
                     sweep_dir=run_dir.parent, config=config,
                     plan_label="FULL_SHARD bf16")
    assert run.sweep_dir == run_dir.parent and run.stage == "trial" and run.trial_number == 3
    assert run.tags == {"sweep": "optuna_dpo", "stage": "trial", "trial": "3", "plan": "FULL_SHARD bf16"}
    assert run.params == {"probe.steps": 0, "model.hf_token": "<redacted>", "model.tokenizer.kind": "byte",
                          "loss.beta": 0.1}


def test_a_single_run_is_its_own_sweep():
    run = RunInfo.of(Config.of({"probe": {"steps": 2}}), run_dir=REPO / "outputs" / "x", name="x", group="x",
                     sweep_dir=None, config={}, plan_label=None)
    assert run.sweep_dir is None and run.stage == "probe" and run.tags == {"sweep": "x", "stage": "probe"}


def test_flatten_keeps_lists_as_values():
    assert flatten({"a": {"b": [1, 2], "c": {"d": None}}}) == {"a.b": [1, 2], "a.c.d": None}


@pytest.mark.parametrize(("overrides", "refused"), [
    (["tracking.mlflow.tracking_uri=http://h:5000"], "MLflow is not among tracking.backends"),
    (["tracking.tensorboard.subdir=tb"], "TensorBoard is not among tracking.backends"),
    (["tracking.backends=[mlflow]", "wandb.project=p"], "W&B is not among tracking.backends"),
    (["tracking.backends=[mlflow]", "tracking.mlflow.tracking_uri=http://h:5000"], None),
])
def test_a_setting_of_a_tracker_not_chosen_is_refused(overrides, refused):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = Config.of(OmegaConf.to_container(compose("config", overrides=overrides), resolve=True))
    if refused is None:
        check_settings_used(cfg, overrides, Launch.DPO_SWEEPS)
        return
    with pytest.raises(InvalidConfig, match=refused):
        check_settings_used(cfg, overrides, Launch.DPO_SWEEPS)


def test_no_tracker_library_is_imported_until_chosen():
    import subprocess
    import sys

    code = ("import sys, dpo_sweeps.runtime.rank, dpo_sweeps.analysis.upload, dpo_sweeps.analysis.report; "
            "print(sorted(m for m in ('mlflow', 'wandb', 'trackio', 'tensorboard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_trackio_says_how_far_it_holds_each_metric_not_only_the_runs_last_step(tmp_path):
    """A kill between Trackio's writes of a step's train and eval records: the eval one is not held, so a
    resumed run sends it (a step-wide floor would skip it). Real Trackio, in a process of its own (it
    reads TRACKIO_DIR when imported)."""
    import subprocess
    import sys

    code = ("import json, trackio; from dpo_sweeps.tracking.trackio_backend import TrackioBackend; "
            "run = trackio.init(project='p', name='r', embed=False, auto_log_cpu=False, auto_log_gpu=False); "
            "[run.log({'train/loss': 1.0 / s}, step=s) for s in range(1, 5)]; run.log({'eval/loss': 0.5}, step=2); "
            "run.finish(); backend = TrackioBackend('p'); backend.run = run; print(json.dumps(backend.logged_steps()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRACKIO_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    (held,) = [line for line in out.stdout.splitlines() if line.startswith("{")]  # Trackio prints too
    assert json.loads(held) == {"train/loss": 4, "eval/loss": 2}
