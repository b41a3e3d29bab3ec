"""wandb: every run logs its config and metrics from rank 0, offline by default; no secret is saved."""

import json
import subprocess
import sys

import pytest
from support import REPO, cli_env
from support.sweeps import run_sweep
from support.wandb_records import run_config_and_history, run_group_and_job_type

from dpo_sweeps.config.schema import Config
from dpo_sweeps.tracking.run_info import job_type_of, sweep_group

SHORT = ["train.max_steps=4", "train.eval_every=2", "data.num_train_pairs=256", "data.num_eval_pairs=32",
         "train.progress_bar=false", "train.save_model=false"]
SECRET_ENV = "wandb-key-4c1d9e77a0b2f3e8"
SECRET_CFG = "hf-token-0f9e8d7c6b5a"


@pytest.mark.slow
def test_offline_run_records_config_and_metrics_and_no_secret(tmp_path):
    run_dir = tmp_path / "run"
    env = cli_env()
    env["WANDB_API_KEY"] = SECRET_ENV
    env.pop("WANDB_MODE", None)
    args = [sys.executable, "-m", "dpo_sweeps", *SHORT, "resources.nproc_per_node=2", "wandb.project=dpo-test",
            "wandb.group=my-sweep", f"+model.hf_token={SECRET_CFG}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "rank 0 alone logs to wandb"
    config, history, group = run_config_and_history(next(runs[0].glob("run-*.wandb")))
    assert group == "my-sweep"
    assert config["loss"]["beta"] == 0.1 and config["resources"]["nproc_per_node"] == 2
    assert config["model"]["hf_token"] == "<redacted>"
    assert config["model"]["tokenizer"]["kind"] == "byte"  # not mistaken for a secret
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_losses = [row["train/loss"] for row in history if "train/loss" in row]
    assert train_losses == [r["train/loss"] for r in logged if "train/loss" in r]
    assert [row["eval/rewards/accuracies"] for row in history if "eval/rewards/accuracies" in row] == \
        [r["eval/rewards/accuracies"] for r in logged if "eval/rewards/accuracies" in r]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config"]["model"]["hf_token"] == "<redacted>"
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET_ENV.encode() not in data, path
            assert SECRET_CFG.encode() not in data, path
    assert SECRET_CFG not in proc.stdout + proc.stderr and SECRET_ENV not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_disabled_mode_writes_nothing_to_wandb(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dpo_sweeps", *SHORT, "wandb.mode=disabled", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (run_dir / "wandb").exists()
    assert not (run_dir / "tracking.json").exists() and "tracking" not in json.loads((run_dir / "summary.json").read_text())


def test_an_unknown_wandb_mode_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dpo_sweeps", *SHORT, "wandb.mode=cloud", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "wandb.mode: got 'cloud' (accepted: offline, online, disabled)" in proc.stderr


def test_an_optuna_trial_in_the_default_sweep_dir_is_grouped_by_date_and_time_and_typed_trial(tmp_path):
    # Hydra's default hydra.sweep.dir is multirun/DATE/TIME: the group keeps the date.
    sweep_dir = tmp_path / "multirun" / "2026-12-01" / "20-37-27"
    result = run_sweep(sweep_dir, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "wandb.mode=offline",
                       "resources.nproc_per_node=1", "train.max_steps=2", "loss.beta=interval(0.05, 0.5)")
    assert result.returncode == 0, result.output[-3000:]
    (run_file,) = (sweep_dir / "0" / "wandb").glob("offline-run-*/run-*.wandb")
    assert run_group_and_job_type(run_file) == ("2026-12-01/20-37-27", "trial")


def test_the_group_names_the_sweep_and_the_job_type_what_a_run_is(tmp_path):
    assert sweep_group(tmp_path / "multirun" / "2026-12-01" / "20-37-27") == "2026-12-01/20-37-27"
    assert sweep_group(tmp_path / "multirun" / "find_best") == "find_best"
    assert sweep_group(tmp_path / "20-37-27") == "20-37-27"  # a time alone, not under a date
    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    (trial_dir / "trial.json").write_text("{}")
    assert job_type_of(Config.of({"probe": {"steps": 3}}), tmp_path) == "probe"  # find_best's stage 2
    assert job_type_of(Config.of({"probe": {"steps": 0}}), tmp_path) == "train"  # its stage 3, a grid run, one run
    assert job_type_of(Config.of({"probe": {"steps": 0}}), trial_dir) == "trial"
