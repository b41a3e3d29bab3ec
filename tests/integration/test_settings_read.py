"""Real runs with a recorder of the config keys they read (tests/support/read_recorder.py): every key a run
leaves unread is one dpo_sweeps/checks/unused.py refuses when it is set on the command line, so no setting
is silently ignored, whatever key a new feature adds or stops reading."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import QUIET, REPO, cli_env

from dpo_sweeps.checks.unused import READ_WHEN, Launch, field_of, unread_keys
from dpo_sweeps.config.schema import Config

pytestmark = pytest.mark.slow
ONE_STEP = ["train.max_steps=1", "train.eval_every=0", "train.batch_size=8", "train.micro_batch_size=4",
            "train.progress_bar=false"]


def _keys_of(overrides: list[str]) -> tuple[set[str], set[str]]:
    """The schema keys this config has, and those the check refuses when set (it does not read them)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    present = {key for key in READ_WHEN if OmegaConfSelect(cfg, key)}
    return present, unread_keys(Config.of(OmegaConf.to_container(cfg, resolve=True)), Launch.DPO_SWEEPS)


def OmegaConfSelect(cfg, key: str) -> bool:  # noqa: N802
    return OmegaConf.select(cfg, key, default="<absent>", throw_on_missing=False) != "<absent>"


def test_every_key_a_run_leaves_unread_is_refused_when_set(tmp_path, hh_path):
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"question": f"q{i} " * 3, "good": f"yes {i}", "bad": f"no {i}"}) + "\n"
                             for i in range(40)))
    saved = tmp_path / "hh_simpo"
    runs = [
        # The defaults: synthetic pairs, dpo, fp32 on one rank, no W&B.
        [*QUIET, *ONE_STEP, "data.num_train_pairs=32", "data.num_eval_pairs=8"],
        # HH from its file, a loss without a reference, bf16, a trained BPE, W&B offline, a saved model and a reply.
        ["data=hh", f"data.path={hh_path}", "data.max_pairs=40", "data.eval_size=8", "data.max_length=96",
         "data.max_prompt_length=64", "loss=simpo", "precision=bf16", "model.tokenizer.kind=bpe",
         "model.tokenizer.vocab_size=300", "wandb.mode=offline", "train.save_model=true", "train.sample_prompts=1",
         "train.sample_max_new_tokens=2", *ONE_STEP],
        # Columns of a local table, a mix with an NLL term, loss scaling, starting from the saved model.
        ["data=preference", f"data.path={prefs}", "data.prompt_column=question", "data.chosen_column=good",
         "data.rejected_column=bad", "data.eval_size=8", "loss=mix",
         "loss.terms=[{name: sigmoid, weight: 1.0}, {name: sft, weight: 0.5}]", "precision=bf16",
         "precision.loss_scaling=true", f"model.init_from={saved}", *QUIET, *ONE_STEP],
    ]
    dirs = [tmp_path / "defaults", saved, tmp_path / "from_saved"]
    argv = [arg for overrides, run_dir in zip(runs, dirs) for arg in ("--", *overrides, f"hydra.run.dir={run_dir}")]
    out = tmp_path / "reads.json"
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "support" / "read_recorder.py"), str(out), *argv],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for result, overrides in zip(json.loads(out.read_text()), runs, strict=True):
        assert result["returncode"] == 0, (overrides, proc.stderr[-3000:])
        read = {field_of(key) for key in result["read"]} - {None}
        present, refused = _keys_of(overrides)
        unread = present - read
        assert unread, "the recorder saw every key read: it records nothing useful"
        assert sorted(unread - refused) == [], f"{overrides}: read by no code, yet not refused when set"
