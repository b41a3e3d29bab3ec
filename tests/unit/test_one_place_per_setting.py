"""One place per setting (issue 49): a setting added to the schema alone, with `setting(...)`, is validated,
listed in `--help` and refused where it is not read, with no other file touched; conf/config.yaml repeats
no default the schema holds; every field of every section (model, each data source, each loss) is a setting."""

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
from dpo_sweeps.checks.unused import ALWAYS, CONDITIONS, check_settings_used, read_when_table
from dpo_sweeps.config.data_schema import DATA_SCHEMAS
from dpo_sweeps.config.schema import ROOT_SCHEMA, Config, TrainConfig
from dpo_sweeps.config.section import choice_fields, setting_fields
from dpo_sweeps.config.setting import AtLeast, ReadWhen, Rule, setting, setting_of
from dpo_sweeps.config.settings_help import settings_help
from dpo_sweeps.dpo.losses.schema import LOSS_SCHEMAS, MixTerm, mix_schema
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
    # A data source's and a loss's keys too, with the schemas that have them and a loss's own range.
    assert "\ndata.data_dir: str | None = set by conf/\n    only in the data schemas hub, preference\n" in run.stdout
    label_smoothing = run.stdout.split("\nloss.label_smoothing: ", 1)[1].split("\nloss.", 1)[0]
    assert "; with exo_pair: a number in (0, 1)" in " ".join(label_smoothing.split())


def test_conf_config_yaml_repeats_no_default_the_schema_holds():
    conf = OmegaConf.load(REPO / "conf" / "config.yaml")
    assert sorted(conf) == ["defaults", "hydra"]  # the groups chosen, and Hydra's own settings
    for key, _, f in setting_fields(Config):
        if setting_of(f) is not None:
            assert OmegaConf.select(conf, key, default="<absent>") == "<absent>", f"{key}: its default is the schema's"


# The schema's fields not made with `setting(...)`, each with why: nothing but these may lack one.
NOT_SETTINGS = {
    # tracking.wandb's former names (config/tracking_schema.py RENAMED): read by no code (Config.of moves their
    # values to the new keys), refused under their new name's rules by checks/unused.py.
    "wandb.mode", "wandb.project", "wandb.entity", "wandb.group",
}


def test_every_field_of_every_section_is_a_setting():
    # Every section's value fields, a data source's and a loss's too (each choice's schema walked).
    keys = [(key, choice, f) for key, choice, _, f in choice_fields(Config)]
    sections = {key.split(".", 1)[0] for key, _, _ in keys}
    assert sections >= {"model", "data", "loss", "train", "resources", "fsdp", "precision", "peft", "perf", "probe",
                        "faults", "checkpoint", "tracking", "cluster"}, sections
    plain = sorted({key for key, _, f in keys if setting_of(f) is None} - NOT_SETTINGS)
    assert plain == [], f"make these with setting(...) (config/setting.py): {plain}"
    assert {choice for key, choice, _ in keys if key.startswith("data.")} == set(DATA_SCHEMAS)
    assert {choice for key, choice, _ in keys if key.startswith("loss.")} == set(LOSS_SCHEMAS)
    # The fields made at run time: a mix of particular terms, and a mix's terms (inside loss.terms).
    for schema in (mix_schema(("robust", "sft", "ipo")), MixTerm):
        assert [f.name for f in dataclasses.fields(schema) if setting_of(f) is None] == [], schema


def test_the_model_data_and_loss_settings_carry_their_rules():
    # Accepted values, from the field: the same refusal lines as before the conversion.
    with pytest.raises(InvalidConfig, match=r"^model.tokenizer.kind: unknown kind 'words' \(accepted: byte, bpe, "
                                            r"pretrained\)$"):
        _typed("model.tokenizer.kind=words").check()
    with pytest.raises(InvalidConfig, match=r"^data.max_pairs: got 0 \(accepted: an integer >= 1, or null for all\)$"):
        _typed("data.max_pairs=0").check()
    with pytest.raises(InvalidConfig, match=r"^data.chat_template: got 'maybe' \(accepted: auto, true, false\)$"):
        _typed("data.chat_template=maybe").check()
    with pytest.raises(InvalidConfig, match=r"^loss.beta: got 0.0 for loss=ipo \(accepted: a number > 0"):
        _typed("loss=ipo", "loss.beta=0").check()
    # Where each is read: the field's read_when, a library's condition named by a Rule.
    table = read_when_table(Config)
    assert table["data.max_length"] == ALWAYS and table["loss.beta"] == ALWAYS
    assert [r.why for r in table["model.tokenizer.vocab_size"]] == [
        "model.init_from's saved model brings its own architecture and tokenizer",
        "only a trained BPE has a vocabulary size to choose"]
    assert table["train.precompute_reference_logps"][0].unused is CONDITIONS["no_reference"]
    assert table["data.data_dir"][0].unused is CONDITIONS["local_data_path"]
    with pytest.raises(InvalidConfig, match=r"^loss.nll_average: set, but not read here: there is no NLL term"):
        check_settings_used(_typed("loss=rpo", "loss.sft_weight=0", "loss.nll_average=batch"),
                            ["loss=rpo", "loss.sft_weight=0", "loss.nll_average=batch"])
    with pytest.raises(InvalidConfig, match=r"^data.length_group_window: set, but not read here"):
        check_settings_used(_typed("data.length_grouped=false", "data.length_group_window=4"),
                            ["data.length_grouped=false", "data.length_group_window=4"])


@dataclass
class TrainWithAnUnknownRule(TrainConfig):
    warm_reference: bool = setting(False, read_when=ReadWhen(Rule("reference_is_warm"), "it is warm", "a cold one"))
    """A throwaway setting whose condition checks/unused.py does not decide (made by this test)."""


@dataclass
class ConfigWithAnUnknownRule(Config):
    train: TrainWithAnUnknownRule = field(default_factory=TrainWithAnUnknownRule)


def test_a_rule_the_checks_do_not_decide_fails_the_table_by_name():
    with pytest.raises(KeyError, match="Rule\\('reference_is_warm'\\), which checks/unused.py CONDITIONS does not"):
        read_when_table(ConfigWithAnUnknownRule)


def test_the_schema_and_its_read_table_import_no_library_they_name():
    # config/ names the conditions that need torch, the data sources or the adapters; checks/ imports them only
    # when it decides one.
    code = ("import sys; import dpo_sweeps; from dpo_sweeps.checks.unused import READ_WHEN; "
            "print(sorted(m for m in ('torch', 'dpo_sweeps.data.sources', 'dpo_sweeps.models.adapters') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr[-2000:]


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
