"""When each setting is read (dpo_sweeps/checks/unused.py): every schema key declared, and the refusals of
keys a config does not read. tests/integration/test_settings_read.py runs real configs with a recorder."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.checks.unused import ALWAYS, READ_WHEN, Launch, check_settings_used, field_of, unread_keys
from dpo_sweeps.config.data_schema import DATA_SCHEMAS
from dpo_sweeps.config.schema import Config
from dpo_sweeps.dpo.losses.schema import LOSS_SCHEMAS
from dpo_sweeps.errors import InvalidConfig


def _fields(cls: type, prefix: str) -> set[str]:
    """The dotted keys of a schema dataclass; a section typed by a dataclass is walked, any other field is a key."""
    # A section a config may leave out (`cluster: ClusterConfig | None`) is walked as its dataclass.
    hints = {name: next((a for a in typing.get_args(h) if dataclasses.is_dataclass(a)), h)
             if type(None) in typing.get_args(h) else h for name, h in typing.get_type_hints(cls).items()}
    keys: set[str] = set()
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= _fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            keys.add(f"{prefix}{f.name}")
    return keys


def schema_keys() -> set[str]:
    """Every key a config can have: the root schema's, and each data source's and loss's (typed per choice)."""
    keys = _fields(Config, "") - {"data", "loss"}
    for schemas, section in ((DATA_SCHEMAS, "data."), (LOSS_SCHEMAS, "loss.")):
        for cls in schemas.values():
            keys |= _fields(cls, section)
    return keys


def test_every_schema_key_is_declared_always_read_or_read_only_when():
    keys = schema_keys()
    assert sorted(keys - READ_WHEN.keys()) == [], "make these fields with setting(...) (config/setting.py)"
    assert sorted(READ_WHEN.keys() - keys) == [], "checks/unused.py names keys the schema does not have"
    for key, rules in READ_WHEN.items():
        assert rules == ALWAYS or (rules and all(rule.why and rule.instead for rule in rules)), key


def _config(*overrides: str) -> Config:
    """The typed Config a run of these overrides reads (Config.of of the resolved composition)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return Config.of(OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True))


def _refusal(overrides: list[str], launch: Launch = Launch.DPO_SWEEPS) -> str | None:
    try:
        check_settings_used(_config(*overrides), overrides, launch)
    except InvalidConfig as exc:
        return str(exc)
    return None


# A setting, the choices that leave it unread (refused, the message's start), and choices that read it.
REFUSED = [
    (["train.sample_max_new_tokens=10", "train.save_model=true"], "train.sample_max_new_tokens: set, but not read here: "
     "no replies are generated at train.sample_prompts=0 (accepted: train.sample_prompts > 0"),
    (["train.sample_prompts=2", "train.save_model=false"], "train.sample_prompts: set, but not read here: the replies"),
    (["model.install_hint=pip install x"], "model.install_hint: set, but not read here: it is shown only when a "
     "model.gguf_file cannot be found (accepted: a model.gguf_file; or leave model.install_hint out)"),
    (["fsdp.reshard_after_forward=false"], "fsdp.reshard_after_forward: set, but not read here: one fp32 rank"),
    (["data.path=prefs.jsonl"], "data.path: set, but not read here: the synthetic task generates"),
    (["precision.name=bf16"], "precision.name: set, but not read here: a run names its precision from"),
    (["loss=simpo", "train.precompute_reference_logps=true"], "train.precompute_reference_logps: set, but not read"),
    (["loss=sigmoid", "loss.reference_free=true", "train.precompute_reference_logps=false"],
     "train.precompute_reference_logps: set, but not read"),
    (["loss=mix", "loss.terms=[{name: sft, weight: 1.0}]", "loss.f_divergence=js_divergence"],
     "loss.f_divergence: set, but not read here: no term of this mix has an f-divergence form"),
    (["loss=mix", "loss.terms=[{name: sigmoid, weight: 1.0}]", "loss.nll_average=batch"],
     "loss.nll_average: set, but not read here: there is no NLL term"),
    (["model.init_from=outputs/sft", "model.from_config.n_layer=4"], "model.from_config: set, but not read here: "
     "model.init_from's saved model"),
    (["model.init_from=outputs/sft", "model.tokenizer.kind=bpe"], "model.tokenizer.kind: set, but not read here"),
    (["resources.nproc_per_node=1", "resources.bind_cores=false"], "resources.bind_cores: set, but not read here"),
    (["resources.master_port=29500", "resources.nproc_per_node=2"], None),  # read: dpo-sweeps starts the ranks
    (["train.sample_max_new_tokens=10", "train.sample_prompts=1", "train.save_model=true"], None),
    (["model.install_hint=pip install x", "model=smollm2_135m"], None),
    (["fsdp.reshard_after_forward=false", "precision=bf16"], None),  # one rank, but wrapped to cast
    (["fsdp.reshard_after_forward=false", "resources.nproc_per_node=2"], None),
    # keep_last prunes the checkpoints a stop signal or the time limit saves with every_steps=0 too.
    (["checkpoint.every_steps=0", "checkpoint.keep_last=5"], None),
    # A probe is the full run's command plus probe.steps: the settings it replaces are not refused.
    (["probe.steps=5", "train.max_steps=200", "train.sample_prompts=1", "train.save_model=true"], None),
    (["loss=mix", "loss.terms=[{name: sigmoid, weight: 1.0}, {name: sft, weight: 0.1}]", "loss.nll_average=batch"],
     None),
]


@pytest.mark.parametrize("overrides, message", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_a_setting_is_refused_exactly_where_the_config_does_not_read_it(overrides, message):
    refusal = _refusal(overrides)
    if message is None:
        assert refusal is None
    else:
        assert refusal is not None and refusal.startswith(message), refusal
        assert refusal.endswith(f"; or leave {refusal.split(':')[0]} out)")


def test_who_starts_the_ranks_decides_the_port_and_the_binding():
    port = ["resources.master_port=29500", "resources.nproc_per_node=2"]
    assert _refusal(port, Launch.DPO_SWEEPS) is None and _refusal(port, Launch.LOCAL).startswith(
        "resources.master_port: set, but not read here: torchrun, or the sweep launcher's tasks")
    assert _refusal(port[:1], Launch.LOCAL) is None  # a one-rank job runs in the job's own process
    assert _refusal(port[:1], Launch.TORCHRUN) is not None
    bind = ["resources.bind_cores=false", "resources.nproc_per_node=2", "resources.device=cpu"]
    assert _refusal(bind, Launch.LOCAL) is None and _refusal(bind, Launch.SLURM) is not None


def test_an_override_inside_a_mapping_key_is_the_key_it_sets():
    assert field_of("model.from_config.n_layer") == "model.from_config"
    assert field_of("loss.terms") == "loss.terms" and field_of("train.nothing") is None
    # Only what the user set is refused: the default config leaves these unread, from its files.
    assert {"faults.step", "data.split", "precision.name", "train.sample_max_new_tokens"} <= unread_keys(_config())
    assert _refusal([]) is None
