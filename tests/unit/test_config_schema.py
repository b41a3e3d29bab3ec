"""The typed config schema (dpo_sweeps/config/schema.py) and the one validation pass (checks/validate.py)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO, cli_env

from dpo_sweeps.checks.schema_errors import schema_refusal
from dpo_sweeps.checks.validate import validate_config
from dpo_sweeps.config import data_schema, schema, section
from dpo_sweeps.config.schema import Config
from dpo_sweeps.dpo.losses import LOSS_SCHEMAS
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.models.gguf import GGUF_MAGIC

CONF = REPO / "conf"
# Group options that compose to a runnable config as they are (preference needs data.path).
GROUP_OPTIONS = {group: sorted(p.stem for p in (CONF / group).glob("*.yaml"))
                 for group in ("model", "data", "loss", "fsdp", "precision", "peft")}


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _typed(cfg) -> Config:
    """The composed config resolved and typed, as a rank reads it."""
    return Config.of(OmegaConf.to_container(cfg, resolve=True))


def _refusal(*overrides: str) -> InvalidConfig:
    with pytest.raises(Exception) as caught:
        _compose(*overrides)
    refusal = schema_refusal(caught.value)
    assert refusal is not None, caught.value
    return refusal


def test_every_schema_field_has_a_docstring():
    undocumented = []
    for module in (schema, data_schema):
        tree = ast.parse(Path(module.__file__).read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            body = cls.body
            for i, node in enumerate(body):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    following = body[i + 1] if i + 1 < len(body) else None
                    documented = (isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                                  and isinstance(following.value.value, str))
                    # Whole sections (train, resources, ...) are documented by their own class's fields.
                    if not documented and not node.annotation.id.endswith("Config"):
                        undocumented.append(f"{cls.name}.{node.target.id}")
    assert undocumented == []


@pytest.mark.parametrize("group", sorted(GROUP_OPTIONS))
def test_every_conf_file_fits_the_schema_and_passes_validation(group, tmp_path):
    for option in GROUP_OPTIONS[group]:
        extra = ["data.path=x.jsonl"] if (group, option) == ("data", "preference") else []
        if (group, option) == ("peft", "qlora"):  # the default model (GPT-2) has no nn.Linear to quantize
            extra = ["model=tiny_llama"]
        cfg = _compose(f"{group}={option}", *extra)
        node = cfg[group]
        if group == "loss":  # typed per loss: exactly the chosen file's keys (dpo/losses/schema.py)
            assert OmegaConf.get_type(node) is LOSS_SCHEMAS[option], option
        assert dataclasses.is_dataclass(OmegaConf.get_type(node)), (group, option)
        if group == "data" and option == "preference":
            continue
        gguf = cfg.model.gguf_file if group == "model" else None
        if gguf and gguf.startswith("pkg://") and importlib.util.find_spec(gguf[6:].partition("/")[0]) is None:
            # The preset's package is not installed here: its refusal says how to install it, and the rest
            # of the preset is checked against a file that exists.
            with pytest.raises(InvalidConfig) as refused:
                validate_config(_typed(cfg), REPO)
            assert refused.value.setting == "model.gguf_file" and cfg.model.install_hint in str(refused.value)
            (tmp_path / "model.gguf").write_bytes(GGUF_MAGIC)  # a file that opens as GGUF does
            cfg.model.gguf_file = str(tmp_path / "model.gguf")
        validate_config(_typed(cfg), REPO)


def test_each_data_source_has_its_own_keys():
    assert OmegaConf.get_type(_compose().data) is data_schema.SyntheticDataConfig
    hh = _compose("data=hh").data
    assert OmegaConf.get_type(hh) is data_schema.HubDataConfig and "noise" not in hh
    assert _refusal("data=hh", "data.noise=0.2").setting == "data.noise"


@pytest.mark.parametrize(("override", "setting", "text"), [
    ("train.batch_size=abc", "train.batch_size", "(accepted: an integer)"),
    ("train.lr_rate=1", "train.lr_rate", "not a setting (accepted: train has batch_size, micro_batch_size"),
    ("resources.device_memory_gib=lots", "resources.device_memory_gib", "(accepted: a number, or null)"),
    ("fsdp.cpu_offload=maybe", "fsdp.cpu_offload", "(accepted: true or false)"),
    ("data.max_prompt_lenght=8", "data.max_prompt_lenght", "did you mean data.max_prompt_length?"),
    ("loss.lr=1", "loss.lr", "is not a hyperparameter of loss=dpo (accepted: its keys: beta, label_smoothing"),
    ("loss.beta=high", "loss.beta", "(accepted: a number)"),
    ("probe.max_seconds=soon", "probe.max_seconds", "(accepted: a number, or null)"),
    ("train.eval_micro_batch_size=big", "train.eval_micro_batch_size", "(accepted: an integer, or null)"),
])
def test_a_wrong_type_or_unknown_key_is_refused_naming_the_key(override, setting, text):
    refusal = _refusal(override)
    assert refusal.setting == setting and text in str(refusal)
    assert "\n" not in str(refusal)


@pytest.mark.parametrize(("content", "what"), [
    (b"", "an empty file"),
    (b'{"model_type": "llama"}', "a config.json renamed"),
    (b"PK\x03\x04" + bytes(60), "a zip archive (a wheel, not the file inside it)"),
], ids=["empty", "json", "zip"])
def test_a_file_that_is_not_gguf_is_refused_before_any_process(tmp_path, content, what):
    """A rank would find it out only when transformers parses the file, after the job started."""
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    cfg = _compose("model=smollm2_135m", f"model.gguf_file={path}")
    with pytest.raises(InvalidConfig) as caught:
        validate_config(_typed(cfg), REPO)
    assert str(caught.value).startswith(f"model.gguf_file: '{path}' is not a GGUF file"), what
    assert "\n" not in str(caught.value)


def test_a_hyperparameter_of_another_loss_is_refused_by_the_loss_check():
    cfg = _compose("loss=dpo", "+loss.gamma=0.5")  # `+` adds the key; the loss check refuses it
    with pytest.raises(InvalidConfig, match=r"^loss.gamma: is not a hyperparameter of loss=dpo"):
        validate_config(_typed(cfg), REPO)


@pytest.mark.parametrize(("override", "message"), [
    ("checkpoint.keep_last=-1", "checkpoint.keep_last: got -1 (accepted: an integer >= 1, or null to keep all)"),
    ("checkpoint.every_steps=-2", "checkpoint.every_steps: got -2"),
    ("train.logps_chunk_size=-5", "train.logps_chunk_size: got -5 (accepted: an integer >= 1, or 0 for full logits)"),
    ("probe.steps=2", "probe.steps: 2 leaves no timed step after perf.warmup_steps=3"),
    ("probe.max_seconds=0", "probe.max_seconds: got 0 (accepted: null (no limit) or a number of seconds > 0)"),
    ("probe.max_seconds=-30", "probe.max_seconds: got -30"),
    ("data.length_group_window=0", "data.length_group_window: got 0"),
    ("train.eval_micro_batch_size=0", "train.eval_micro_batch_size: got 0 (accepted: an integer >= 1, or null for "
                                      "as many as fit in a training micro-batch's memory)"),
    ("train.lr_schedule=warmup_cosine", "train.lr_schedule: unknown schedule 'warmup_cosine' "
                                        "(accepted: constant, linear, cosine)"),
    ("model.tokenizer.kind=bpe", "model.tokenizer.vocab_size: got None (accepted: an integer >= 259 for kind=bpe)"),
    ("precision=fp16", None),
])
def test_config_only_checks_run_before_any_process(override, message):
    cfg = _compose(override)
    if message is None:
        validate_config(_typed(cfg), REPO)
        return
    with pytest.raises(InvalidConfig) as caught:
        validate_config(_typed(cfg), REPO)
    assert str(caught.value).startswith(message)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpo_sweeps", *args], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=300)


def test_the_cli_refuses_a_wrong_type_in_one_line_for_a_run_and_a_sweep(tmp_path):
    run = _cli(tmp_path, "train.batch_size=abc", f"hydra.run.dir={tmp_path / 'run'}")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "error: train.batch_size: Value 'abc' of type 'str' could not be converted to Integer (accepted: an integer)"]
    sweep = _cli(tmp_path, "-m", "train.lr_rate=1", "fsdp=full_shard,shard_grad_op", f"hydra.sweep.dir={tmp_path / 's'}")
    assert sweep.returncode == 1
    lines = sweep.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: train.lr_rate: not a setting"), sweep.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "s").exists()


def test_a_sweep_with_bad_points_lists_each_and_launches_nothing(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = _cli(tmp_path, "-m", "checkpoint.keep_last=-1,2", "train.logps_chunk_size=-5,1024",
                  f"hydra.sweep.dir={sweep_dir}")
    assert result.returncode == 1
    assert "3 of 4 points of this sweep are invalid; no job was started" in result.stderr, result.stderr[-2000:]
    assert "#2  checkpoint.keep_last=2 train.logps_chunk_size=-5" in result.stderr
    assert "invalid_config: train.logps_chunk_size: got -5" in result.stderr
    assert "#1  checkpoint.keep_last=-1 train.logps_chunk_size=1024" in result.stderr
    assert "invalid_config: checkpoint.keep_last: got -1" in result.stderr
    assert not sweep_dir.exists()


def test_a_setting_the_config_does_not_read_is_refused_for_a_run_and_for_a_sweep_that_never_reads_it(tmp_path):
    run = _cli(tmp_path, "faults.step=3", f"hydra.run.dir={tmp_path / 'run'}")
    assert run.returncode == 1 and run.stderr.strip().splitlines() == [
        "error: faults.step: set, but not read here: no fault is injected with faults.kind=null "
        "(accepted: faults.kind=crash (or another kind); or leave faults.step out)"], run.stderr
    # In a sweep, a setting read at some points is fine; one that no point reads is refused in one line.
    sweep = _cli(tmp_path, "-m", "fsdp=full_shard,shard_grad_op", "resources.nproc_per_node=2",
                 "fsdp.hybrid_group_size=2", f"hydra.sweep.dir={tmp_path / 's'}")
    assert sweep.returncode == 1 and sweep.stderr.strip().splitlines() == [
        "error: fsdp.hybrid_group_size: set, but not read at any of the 2 points that set it: only hybrid_shard "
        "has shard groups (accepted: fsdp=hybrid_shard; or leave fsdp.hybrid_group_size out); no job was started"
    ], sweep.stderr
    read_somewhere = _cli(tmp_path, "-m", "fsdp=full_shard,hybrid_shard", "resources.nproc_per_node=4",
                          "fsdp.hybrid_group_size=2", "hydra.sweeper.dry_run=true", f"hydra.sweep.dir={tmp_path / 's'}")
    assert read_somewhere.returncode == 0, read_somewhere.stderr[-2000:]
    assert not (tmp_path / "run").exists() and not (tmp_path / "s").exists()


def test_the_schema_modules_import_only_dataclasses_omegaconf_and_hydra():
    allowed = {"__future__", "collections", "dataclasses", "typing", "omegaconf", "hydra", "dpo_sweeps"}
    for module in (schema, data_schema, section):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert {name.split(".")[0] for name in imported} <= allowed, imported
        # dpo_sweeps.errors imports only the standard library (InvalidConfig, the one-line refusal)
        assert all(not name.startswith("dpo_sweeps") or name.startswith("dpo_sweeps.config")
                   or name == "dpo_sweeps.errors" for name in imported), imported


def test_a_resolved_config_is_read_as_frozen_typed_sections():
    from dpo_sweeps.train.probe import probe_config

    cfg = _typed(_compose("loss=mix", "data=hh", "data.path=x.jsonl", "probe.steps=8", "resources.nproc_per_node=2"))
    assert isinstance(cfg.train, schema.TrainConfig) and isinstance(cfg.model.tokenizer, schema.TokenizerConfig)
    assert isinstance(cfg.data, data_schema.HubDataConfig)  # data as its source's, loss as its loss's
    assert isinstance(cfg.loss, LOSS_SCHEMAS["mix"]) and all(t.name and t.weight >= 0 for t in cfg.loss.terms)
    assert cfg.world_size == 2 and cfg.loss.beta == 0.1
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.lr = 1.0  # resolved: nothing changes it
    probe = probe_config(cfg, cfg.world_size)  # a probe derives its own
    assert (probe.train.max_steps, probe.checkpoint.every_steps, cfg.train.max_steps) == (8, 0, 120)


def test_a_sweep_checks_again_where_its_points_differ_in_a_setting_a_check_reads(tmp_path):
    """Points are validated once per validation_key: a setting a section's check reads must be in it."""
    from dpo_sweeps.launchers.preflight import CheckedConfig

    checked = CheckedConfig()
    points = [OmegaConf.to_container(_compose("train.sample_prompts=2", f"train.save_model={saved}"), resolve=True)
              for saved in ("true", "false")]
    assert checked.validate(points[0], tmp_path) is None
    refused = checked.validate(points[1], tmp_path)
    assert isinstance(refused, InvalidConfig) and str(refused).startswith(
        "train.sample_prompts: 2 with train.save_model=false"), refused
    assert checked.of(points[0]).train.save_model is True  # the typed config follows the point asked for


@pytest.mark.parametrize(("override", "text"), [
    ("~train.sample_prompts", "train.sample_prompts: a setting of the schema cannot be deleted (~)"),
    ("~model.name_or_path", "model.name_or_path: a setting of the schema cannot be deleted (~)"),
    ("~train.no_such_key", "'train.no_such_key' does not exist"),
])
def test_an_override_hydra_cannot_merge_says_why_in_one_line(override, text):
    # Hydra's "Error merging override X" names the override; why is in its cause (OmegaConf's refusal).
    from hydra.errors import ConfigCompositionException

    from dpo_sweeps.checks.schema_errors import one_line_message

    with pytest.raises(ConfigCompositionException) as caught:
        _compose(override)
    message = one_line_message(caught.value)
    assert text in message and "\n" not in message, message


def test_a_group_given_null_or_a_number_is_one_line_listing_its_options(tmp_path):
    # Hydra parses `model=null` / `data=1` as null and a number, and raises a bare ValueError on them.
    for args, group in ((["model=null"], "model"), (["data=1"], "data")):
        run = _cli(tmp_path, *args, f"hydra.run.dir={tmp_path / 'run'}")
        assert run.returncode == 1 and run.stderr.strip().splitlines()[-1].startswith(
            f"error: {group}: got '{args[0].split('=')[1]}': a config group takes the name of one of its options"
        ), run.stderr[-2000:]
        assert "Traceback" not in run.stderr and not (tmp_path / "run").exists()
    from dpo_sweeps.checks.schema_errors import group_refusal

    refusal = group_refusal(ValueError("Config group override must be a string or a list. Got NoneType"),
                            ["train.lr=1", "fsdp=null"])
    assert refusal.setting == "fsdp" and "full_shard" in str(refusal) and "shard_grad_op" in str(refusal)
    assert group_refusal(ValueError("another"), ["fsdp=null"]) is None


@pytest.mark.parametrize(("args", "group", "removal"), [
    (["~data"], "data", "~data"),
    (["~model=tiny_gpt2"], "model", "~model"),
    (["-m", "~loss@loss", "loss.beta=0.1,0.2"], "loss", "~loss@loss"),
    (["-m", "fsdp=full_shard,shard_grad_op", "~precision"], "precision", "~precision"),
])
def test_removing_a_group_every_run_composes_is_one_line_listing_its_options_before_any_folder(
        tmp_path, args, group, removal):
    # Hydra takes `~data`; the run then failed on data.max_length, with its run directory made.
    out = tmp_path / "out"
    run = _cli(tmp_path, *args, f"hydra.{'sweep' if args[0] == '-m' else 'run'}.dir={out}")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    options = "|".join(sorted(p.stem for p in (REPO / "conf" / group).glob("*.yaml")))
    assert run.stderr.strip().splitlines()[-1] == (
        f"error: {group}: {removal} removes it, and every run needs one (accepted: {group}={options} to choose another)")
    assert not out.exists()


def test_the_api_refuses_removing_a_group_and_hydra_still_judges_the_rest():
    from dpo_sweeps import api
    from dpo_sweeps.checks.schema_errors import removed_group_refusal

    with pytest.raises(InvalidConfig, match=r"^fsdp: ~fsdp removes it"):
        api.compose(["~fsdp"])
    # Settings and groups that are not composed by every run are Hydra's and the schema's to judge.
    assert removed_group_refusal(["~train.lr", "~sweep", "~hydra/launcher", "data=hh", "+sweep=quickstart"]) is None


@pytest.mark.parametrize("setting", ["data.max_length", "train.batch_size", "loss.beta", "precision.param_dtype"])
def test_a_required_setting_left_unset_gets_an_example_the_checks_accept(setting):
    with pytest.raises(Exception) as caught:  # as the CLI reads it (dpo_sweeps/app.py)
        OmegaConf.to_container(_compose(f"{setting}=???"), resolve=True, throw_on_missing=True)
    refusal = schema_refusal(caught.value)
    assert str(refusal).startswith(f"{setting}: required, and not set (???)"), refusal
    example = str(refusal).split(f"e.g. {setting}=", 1)[1].rstrip(")")
    validate_config(_typed(_compose(f"{setting}={example}")), REPO)  # the example composes, types and passes


def test_a_refused_run_leaves_no_folder_of_hydras_default_run_dir(tmp_path):
    # outputs/<date>/<time> is made by Hydra before the config is read; refused, all of it goes.
    (tmp_path / "mine").mkdir()
    run = subprocess.run([sys.executable, "-m", "dpo_sweeps", "data.max_length=???"], cwd=tmp_path, env=cli_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "data.max_length: required, and not set" in run.stderr, run.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_a_probe_time_limit_is_read_by_probes_only_and_find_best_passes_it_to_its_probes():
    from dpo_sweeps.checks.unused import unread_keys
    from dpo_sweeps.launchers.find_best import Stages
    from dpo_sweeps.launchers.preflight import InvalidSweep

    assert "probe.max_seconds" in unread_keys(_typed(_compose("probe.max_seconds=30")))
    assert "probe.max_seconds" not in unread_keys(_typed(_compose("probe.steps=8", "probe.max_seconds=30")))
    stages = {"systems": {"precision": "fp32"}, "algorithm": {"loss.beta": "0.1"}}
    assert Stages.of(stages).probe_overrides() == ["probe.steps=10"]
    assert Stages.of({**stages, "probe_max_seconds": 90}).probe_overrides() == ["probe.steps=10", "probe.max_seconds=90"]
    for bad in (0, -1, "soon", True):
        with pytest.raises(InvalidSweep, match=r"^hydra.sweeper.stages.probe_max_seconds: got .* \(accepted: null"):
            Stages.of({**stages, "probe_max_seconds": bad})
