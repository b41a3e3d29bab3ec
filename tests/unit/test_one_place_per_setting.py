"""One place per setting (issue 49): a setting added to the schema alone, with `setting(...)`, is validated,
listed in `--help` and refused where it is not read, with no other file touched; conf/config.yaml repeats
no default the schema holds."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from support import REPO, cli_env

from dpo_sweeps.checks.schema_errors import schema_refusal
from dpo_sweeps.checks.unused import ALWAYS, check_settings_used, read_when_table
from dpo_sweeps.config.schema import ROOT_SCHEMA, Config, TrainConfig
from dpo_sweeps.config.section import setting_fields
from dpo_sweeps.config.setting import AtLeast, ReadWhen, setting, setting_of
from dpo_sweeps.config.settings_help import settings_help
from dpo_sweeps.errors import InvalidConfig


@dataclass
class TrainWithEcho(TrainConfig):
    echo_replies: bool = setting(False, read_when=ReadWhen(
        lambda c, _: not c.train.sample_prompts, "no replies are generated at train.sample_prompts=0",
        "train.sample_prompts > 0"))
    """Print each reply samples.json gets (a throwaway setting, made by this test)."""
    echo_width: int = setting(80, accepted=AtLeast(20))
    """Columns the echoed replies are wrapped to (a throwaway setting, made by this test)."""


@dataclass
class ConfigWithEcho(Config):
    train: TrainWithEcho = field(default_factory=TrainWithEcho)


@pytest.fixture
def echo_schema():
    """ConfigWithEcho stored as the root schema conf/config.yaml names, for this test only."""
    store = ConfigStore.instance()
    store.store(name=ROOT_SCHEMA, node=ConfigWithEcho)
    try:
        yield
    finally:
        store.store(name=ROOT_SCHEMA, node=Config)


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _typed(*overrides: str) -> ConfigWithEcho:
    return ConfigWithEcho.of(OmegaConf.to_container(_compose(*overrides), resolve=True))


def test_a_setting_added_to_the_schema_alone_is_validated_documented_and_refused_where_not_read(echo_schema):
    # Composed from conf/ as it is: its default comes from the schema, and Hydra types it.
    assert _typed().train.echo_replies is False and _typed().train.echo_width == 80
    with pytest.raises(Exception) as caught:
        _typed("train.echo_replies=maybe")
    assert str(schema_refusal(caught.value)).startswith("train.echo_replies: ")
    assert str(schema_refusal(caught.value)).endswith("(accepted: true or false)")
    # Its accepted values, checked by the section from the field's metadata.
    with pytest.raises(InvalidConfig, match=r"^train.echo_width: got 5 \(accepted: an integer >= 20\)$"):
        _typed("train.echo_width=5").check()
    _typed("train.echo_width=20").check()
    # Where it is read, and where it is not.
    assert read_when_table(ConfigWithEcho)["train.echo_width"] == ALWAYS
    on = ["train.echo_replies=true"]
    with pytest.raises(InvalidConfig, match=r"^train.echo_replies: set, but not read here: no replies are generated "
                                            r"at train.sample_prompts=0 \(accepted: train.sample_prompts > 0; or "
                                            r"leave train.echo_replies out\)$"):
        check_settings_used(_typed(*on), on)
    check_settings_used(_typed(*on, "train.sample_prompts=2"), [*on, "train.sample_prompts=2"])
    # Listed in --help's settings, with what it accepts and when it is read.
    listing = settings_help(ConfigWithEcho)
    assert "train.echo_width: int = 80\n    accepted: an integer >= 20\n    Columns the echoed replies" in listing
    entry = " ".join(listing.split("train.echo_replies: ", 1)[1].split("\ntrain.")[0].split())
    assert entry.startswith("bool = false not read, and refused when set, where no replies are generated at "
                            "train.sample_prompts=0 (instead: train.sample_prompts > 0) Print each reply"), entry


def test_help_lists_every_setting_from_the_schema():
    run = subprocess.run([sys.executable, "-m", "dpo_sweeps", "--help"], env=cli_env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "== Settings ==" in run.stdout and "== Config ==" in run.stdout
    assert "train.batch_size: int = 32\n    accepted: an integer >= 1\n    Global batch" in run.stdout
    assert "$DPO_SWEEPS_CACHE/reference_logps" in run.stdout  # a `$` in a docstring is text, not a template's
    for key, _, _ in setting_fields(Config):
        assert f"\n{key}: " in run.stdout, key


def test_conf_config_yaml_repeats_no_default_the_schema_holds():
    conf = OmegaConf.load(REPO / "conf" / "config.yaml")
    assert sorted(conf) == ["defaults", "hydra"]  # the groups chosen, and Hydra's own settings
    for key, _, f in setting_fields(Config):
        if setting_of(f) is not None:
            assert OmegaConf.select(conf, key, default="<absent>") == "<absent>", f"{key}: its default is the schema's"
    # Converted whole: every field of train and resources is made with setting(...).
    for section in ("train.", "resources.", "fsdp.", "precision.", "peft.", "perf.", "probe.", "faults.", "checkpoint.",
                    "tracking.", "cluster."):
        plain = [key for key, _, f in setting_fields(Config) if key.startswith(section) and setting_of(f) is None]
        assert plain == [], plain


def test_a_setting_made_with_setting_keeps_its_default_when_the_section_is_built_from_a_resolved_config():
    # Config.of of an older run's config that lacks a key: the schema's default, as before.
    train = TrainConfig.of({"batch_size": 16})
    assert train.batch_size == 16 and train.max_steps == 120 and train.lr_schedule == "constant"
    assert {f.name for f in dataclasses.fields(TrainConfig)} >= {"batch_size", "reference_sync"}


def test_a_setting_older_runs_lack_leaves_their_hash_as_it_was_at_its_default():
    from dpo_sweeps.rundir.hashing import config_hash

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        now = OmegaConf.to_container(compose("config"), resolve=True)
    now.pop("hydra", None)
    added = [(key, f.default) for key, _, f in setting_fields(Config) if (s := setting_of(f)) and s.older_runs_lack]
    assert ("train.zero_shot_eval", False) in added
    for key, default in added:
        section, name = key.rsplit(".", 1)
        older = OmegaConf.create(now)
        del OmegaConf.select(older, section)[name]  # a run written before the setting existed
        assert config_hash(OmegaConf.to_container(older)) == config_hash(now), key
        changed = OmegaConf.create(now)
        OmegaConf.update(changed, key, not default if isinstance(default, bool) else 7)
        assert config_hash(OmegaConf.to_container(changed)) != config_hash(now), key


def test_a_lora_setting_is_checked_with_adapters_and_refused_in_one_line_with_peft_none():
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        lora = Config.of(OmegaConf.to_container(compose("config", overrides=["peft=lora", "peft.r=0"]), resolve=True))
        full = Config.of(OmegaConf.to_container(compose("config", overrides=["peft.r=8"]), resolve=True))
    with pytest.raises(InvalidConfig, match=r"^peft.r: got 0 \(accepted: an integer >= 1 \(the adapters' rank\)\)$"):
        lora.check()
    with pytest.raises(InvalidConfig) as refused:
        check_settings_used(full, ["peft.r=8"])
    assert str(refused.value) == ("peft.r: set, but not read here: peft=none is a full fine-tune: there are no "
                                  "adapters (accepted: peft=lora or peft=qlora; or leave peft.r out)")
