"""`tracking.wandb` beside the other trackers (issue 49): the old `wandb.*` keys still work for one release,
as the same setting, with a one-line notice; a config from before the rename reads as it did."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO, cli_env

from dpo_sweeps.checks.unused import check_settings_used, rename_notice, unread_keys
from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.rundir.hashing import config_hash


def _resolved(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        config = OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)
    config.pop("hydra", None)
    return config


@pytest.mark.parametrize("key, value", [("mode", "online"), ("project", "p1"), ("entity", "team"), ("group", "g")])
def test_an_old_key_sets_the_new_one(key, value):
    old = Config.of(_resolved(f"wandb.{key}={value}"))
    new = Config.of(_resolved(f"tracking.wandb.{key}={value}"))
    assert getattr(old.tracking.wandb, key) == value and old.tracking == new.tracking


def test_a_config_from_before_the_rename_reads_as_it_did_and_keeps_its_hash():
    before = _resolved()
    before["wandb"] = {"mode": "disabled", "project": "old", "entity": None, "group": "g0"}
    del before["tracking"]["wandb"]  # as a summary.json written before issue 49 holds it
    cfg = Config.of(before)
    assert (cfg.tracking.wandb.mode, cfg.tracking.wandb.project, cfg.tracking.wandb.group) == ("disabled", "old", "g0")
    assert config_hash(before) == config_hash(_resolved("tracking.wandb.mode=disabled", "wandb.project=x"))


def test_an_old_key_is_checked_by_its_new_name_after_a_notice(capsys):
    given = ["wandb.mode=disabled", "wandb.project=p"]
    with pytest.raises(InvalidConfig, match=r"^tracking.wandb.project: set, but not read here: nothing is logged to "
                                            r"W&B with tracking.wandb.mode=disabled"):
        check_settings_used(Config.of(_resolved(*given)), given)
    notice = capsys.readouterr().err
    assert notice == (rename_notice(["wandb.mode", "wandb.project"]) + "\n") and len(notice.splitlines()) == 1
    assert notice.startswith("notice: wandb.mode is now tracking.wandb.mode, wandb.project is now "
                             "tracking.wandb.project (the old names are accepted until the next release)")
    check_settings_used(Config.of(_resolved("wandb.mode=offline")), ["wandb.mode=offline"])  # read: no refusal
    # The old section itself is read by nothing (its values moved), so it is never counted as read.
    assert {"wandb.mode", "wandb.project"} <= unread_keys(Config.of(_resolved()))


def test_the_cli_refuses_a_wrong_mode_under_either_name_in_one_line(tmp_path):
    for key in ("wandb.mode", "tracking.wandb.mode"):
        run = subprocess.run([sys.executable, "-m", "dpo_sweeps", f"{key}=cloud", f"hydra.run.dir={tmp_path / key}"],
                             cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
        assert run.returncode == 1, run.stderr[-2000:]
        errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, run.stderr[-2000:]
        assert "tracking.wandb.mode: got 'cloud' (accepted: offline, online, disabled)" in errors[0]
        assert run.stderr.count("notice: wandb.mode is now tracking.wandb.mode") == (key == "wandb.mode")


def test_where_both_names_are_given_the_new_one_wins():
    both = Config.of(_resolved("wandb.mode=disabled", "tracking.wandb.mode=online", "wandb.group=g"))
    assert both.tracking.wandb.mode == "online" and both.tracking.wandb.group == "g"
