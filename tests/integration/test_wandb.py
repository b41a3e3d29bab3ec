"""wandb: every run logs its config and metrics from rank 0, offline by default; no secret is saved."""

import json
import subprocess
import sys

import pytest
from support import REPO, cli_env
from support.wandb_records import run_config_and_history

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


def test_an_unknown_wandb_mode_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dpo_sweeps", *SHORT, "wandb.mode=cloud", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "wandb.mode: got 'cloud' (accepted: offline, online, disabled)" in proc.stderr
