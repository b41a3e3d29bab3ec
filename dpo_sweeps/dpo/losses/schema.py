"""The typed schema of `loss.*`: one dataclass per loss, made from the registry's table.

Each `loss=NAME` has exactly the keys of conf/loss/NAME.yaml: `name`, its own hyperparameters and the
modifiers it takes (registry.py says which). The dataclass of each is made here from that table and
stored in Hydra's ConfigStore as `schema/loss/NAME`; conf/config.yaml's defaults list types the chosen
loss with it (`schema/loss@loss: ${loss}`), so Hydra refuses a key the loss does not have
(`loss.gamma=0.5` with loss=sigmoid) and a value of the wrong type (`loss.beta=abc`) while composing.
Every field is a `setting` (config/setting.py): its accepted values (`InRange` of the registry's
`Hyperparameter`) and the condition under which a run reads it (`READ_WHEN`: `loss.nll_average` only with an
NLL term) beside its type; `LossConfig.check`, the grid check before launch, checks/unused.py, `--help` and the
config reference page read them there.

Values and their documentation live in conf/loss/NAME.yaml, once: that file is what a user reads to
learn a loss (its paper, formula and each key's meaning) and what a sweep overrides, as every other
group of conf/ chooses the values of its schema. The fields here are MISSING until it sets them.

`loss=mix` is the one loss whose keys depend on its settings: its terms bring their own hyperparameters
(`+loss.label_smoothing=0.1` for a robust term). Its dataclass types the keys every mix has, `terms` a
list of typed `MixTerm`s; a resolved mix is read as the dataclass of its terms (`mix_schema`), which adds
their keys. `loss_config` reads a resolved config's `loss` as its loss's dataclass; its `check` refuses
what check_loss_config refuses (dpo/losses/__init__.py): an unknown loss, a key that is not the loss's, a
key it lacks, a value out of its field's range, a mix whose weights are all 0.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, make_dataclass
from functools import cache
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from dpo_sweeps.config.schema import BUILDERS
from dpo_sweeps.config.schema import LOSS_SCHEMAS as CONFIG_LOSS_SCHEMAS
from dpo_sweeps.config.section import Section, refuse
from dpo_sweeps.config.setting import Accepted, OneOf, ReadWhen, setting, setting_of
from dpo_sweeps.dpo.losses.registry import (
    F_DIVERGENCE_TERMS,
    HYPERPARAMETERS,
    LOSSES,
    MIX,
    MIX_TERMS,
    NAMES,
    Hyperparameter,
    LossSpec,
    mix_keys,
)
from dpo_sweeps.errors import InvalidConfig


@dataclass(frozen=True)
class InRange(Accepted):
    """A loss hyperparameter's accepted values, the registry's `Hyperparameter`, as a setting carries them."""

    hyperparameter: Hyperparameter

    @property
    def text(self) -> str:
        return self.hyperparameter.accepted

    def check(self, value: Any, setting: str) -> None:
        if not self.hyperparameter.check(value):
            refuse(setting, f"got {value!r}", self.text)


# ------------------------------------------------------------------ when a loss key is read (checks/unused.py)
def _mix_terms(cfg: Any) -> list[str]:
    """A mix's term names (terms the loss schema could not type, which validation refuses, as given)."""
    if cfg.loss.name != MIX:
        return []
    return [term.name if isinstance(term, Section) else term.get("name") if isinstance(term, Mapping) else None
            for term in cfg.loss.terms]


def _mix_without(key: str) -> Callable[[Any, Any], bool]:
    """A mix none of whose terms takes `key` (their specs in the loss registry)."""
    def unused(cfg: Any, _: Any) -> bool:
        return cfg.loss.name == MIX and not any(t in LOSSES and key in LOSSES[t].keys for t in _mix_terms(cfg))
    return unused


def _nll_unused(cfg: Any, _: Any) -> bool:
    """No NLL term: sft_weight 0 (a loss with an NLL modifier), or a mix without an sft term."""
    loss = cfg.loss
    if loss.name == MIX:
        return "sft" not in _mix_terms(cfg)
    return getattr(loss, "sft_weight", None) == 0  # a loss without sft_weight has no nll_average either


def _alpha_unused(cfg: Any, launch: Any) -> bool:
    return getattr(cfg.loss, "f_divergence", None) != "alpha_divergence" or _mix_without("f_divergence")(cfg, launch)


# The loss keys a run reads only beside other choices; every other key of a loss is read whenever it is the loss's.
READ_WHEN: dict[str, ReadWhen] = {
    "f_divergence": ReadWhen(_mix_without("f_divergence"), "no term of this mix has an f-divergence form",
                             "a term such as sigmoid"),
    "f_alpha_divergence_coef": ReadWhen(_alpha_unused, "it is alpha_divergence's alpha",
                                        "loss.f_divergence=alpha_divergence"),
    "nll_average": ReadWhen(_nll_unused, "there is no NLL term (loss.sft_weight=0, or a mix without sft)",
                            "loss.sft_weight > 0, or an sft term"),
    "reference_free": ReadWhen(_mix_without("reference_free"), "no term of this mix compares with a reference",
                               "a term such as sigmoid"),
}


def hyperparameter(key: str, hp: Hyperparameter) -> Any:
    """The field of `loss.<key>`: MISSING until its conf/loss file sets it (a loss's values and their
    documentation live there, once), what it accepts (`hp`: the loss's range) and when it is read."""
    return setting(accepted=InRange(hp), read_when=READ_WHEN.get(key, ()))


@dataclass
class LossConfig(Section):
    """`loss.*` of one loss: `name` and exactly its hyperparameters (a subclass per loss, LOSS_SCHEMAS)."""

    at = "loss"

    name: str = setting(accepted=OneOf(NAMES, unknown="loss"))
    """The conf/loss file chosen (`loss=NAME`), as the registry names it."""

    @classmethod
    def accepted(cls, key: str) -> Hyperparameter | None:
        """The registry's range of `loss.<key>` for this loss (its field's setting)."""
        spec = next((setting_of(f) for f in fields(cls) if f.name == key), None)
        return spec.accepted_values.hyperparameter if spec is not None and isinstance(spec.accepted_values, InRange) else None

    def check(self) -> None:
        """check_loss_config of the keys the config gave (`given`: a key added with `+` that the loss does not
        have is refused, as one it lacks), then a mix's weights."""
        check_loss_config(self.given)
        if self.name == MIX and all(term.weight == 0 for term in self.terms):
            refuse("loss.terms", "every weight is 0: there is no loss to learn from", "at least one term with a weight > 0")

    @property
    def given(self) -> Mapping[str, Any]:
        """The keys and values the resolved config gave, as it gave them (loss_config; a loss Hydra composed:
        its fields)."""
        return getattr(self, "_given", None) or asdict(self)


@dataclass
class MixTerm(Section):
    """One term of `loss=mix`: a TRL loss type and its weight in the sum."""

    name: str = setting()
    """A loss of registry.MIX_TERMS."""
    weight: float = setting()
    """Its weight (>= 0)."""


def _field_type(hp: Hyperparameter) -> Any:
    # OmegaConf reads Optional[...], the spelling of a nullable field it has always known.
    return Optional[float] if hp.type == float | None else hp.type  # noqa: UP045


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Loss"


def _schema_of(spec: LossSpec) -> type[LossConfig]:
    """The dataclass of one loss, its fields in its conf/loss file's order."""
    keys = spec.keys[1:]  # after `name`, which LossConfig has
    return make_dataclass(
        _class_name(spec.name),
        [(key, _field_type(spec.hyperparameter(key)), hyperparameter(key, spec.hyperparameter(key))) for key in keys],
        bases=(LossConfig,),
        namespace={"__module__": __name__, "__doc__": f"`loss={spec.name}`: {spec.paper} (conf/loss/{spec.name}.yaml)."},
    )


def _mix_schema() -> type[LossConfig]:
    """`loss=mix`: the keys every mix has (conf/loss/mix.yaml), `terms` typed term by term."""
    shared = [key for key in mix_keys([]) if key not in ("name", "terms")]
    return make_dataclass(
        "MixLoss",
        [("terms", list[MixTerm], setting())]
        + [(key, _field_type(HYPERPARAMETERS[key]), hyperparameter(key, HYPERPARAMETERS[key])) for key in shared],
        bases=(LossConfig,),
        namespace={"__module__": __name__, "__doc__": "`loss=mix`: a weighted sum of TRL loss types (conf/loss/mix.yaml)."},
    )


LOSS_SCHEMAS: dict[str, type[LossConfig]] = {name: _schema_of(spec) for name, spec in LOSSES.items()}
LOSS_SCHEMAS[MIX] = _mix_schema()


@cache
def mix_schema(terms: tuple[str, ...]) -> type[LossConfig]:
    """The dataclass of a mix of these terms: MixLoss's keys and the terms' own hyperparameters."""
    base = LOSS_SCHEMAS[MIX]
    have = {f.name for f in fields(base)}
    own = [key for key in mix_keys(list(terms)) if key not in have]
    return make_dataclass(
        "MixLoss_" + "_".join(dict.fromkeys(terms)),
        [(key, _field_type(HYPERPARAMETERS[key]), hyperparameter(key, HYPERPARAMETERS[key])) for key in own],
        bases=(base,), namespace={"__module__": __name__, "__doc__": f"`loss=mix` of {', '.join(terms)}."},
    )


def _term_names(terms: Any) -> tuple[str, ...] | None:
    """The names of a mix's terms, when they are terms a mix takes (else check refuses them)."""
    if not isinstance(terms, Sequence) or isinstance(terms, str) or not terms:
        return None
    names = tuple(t.get("name") if isinstance(t, Mapping) else None for t in terms)
    ok = all(isinstance(t, Mapping) and set(t) == {"name", "weight"} for t in terms) and set(names) <= set(MIX_TERMS)
    return names if ok else None


def loss_config(values: Mapping[str, Any]) -> LossConfig:
    """A resolved config's `loss` as its loss's dataclass (a mix's: of its terms), whatever keys it has:
    the keys it gave are kept (`given`) for `check`, which refuses what does not fit the loss."""
    name = values.get("name")
    terms = _term_names(values.get("terms")) if name == MIX else None
    schema = mix_schema(terms) if terms else LOSS_SCHEMAS.get(name, LossConfig)
    known = {f.name for f in fields(schema)}
    kwargs = {key: value for key, value in values.items() if key in known}
    if terms:
        kwargs["terms"] = [MixTerm.of(term) for term in values["terms"]]
    loss = schema(**kwargs)
    object.__setattr__(loss, "_given", dict(values))
    return loss


def register() -> None:
    """Store each loss's dataclass as `schema/loss/NAME` (idempotent); conf/config.yaml types `loss` with it."""
    store = ConfigStore.instance()
    for name, node in LOSS_SCHEMAS.items():
        store.store(group="schema/loss", name=name, node=node)


# ------------------------------------------------------------------ checks (LossConfig.check runs them)
_NAME = next(f for f in fields(LossConfig) if f.name == "name")


def _refuse(key: str, problem: str, accepted: str) -> None:
    raise InvalidConfig(f"loss.{key}", problem, accepted)


def _check_terms(terms: Any) -> list[str]:
    example = "e.g. 'loss.terms=[{name: sigmoid, weight: 1.0}, {name: sft, weight: 0.2}]'"
    if not isinstance(terms, Sequence) or isinstance(terms, str) or not terms:
        _refuse("terms", f"got {terms!r}", f"a non-empty list of {{name, weight}}, {example}")
    for i, term in enumerate(terms):
        if not isinstance(term, Mapping) or set(term) != {"name", "weight"}:
            _refuse(f"terms[{i}]", f"got {term!r}", f"{{name: <loss>, weight: <number>}}, {example}")
        if term["name"] not in MIX_TERMS:
            _refuse(f"terms[{i}].name", f"'{term['name']}' cannot be a term", ", ".join(MIX_TERMS))
        weight = term["weight"]
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0:
            _refuse(f"terms[{i}].weight", f"got {weight!r}", "a number >= 0")
    return [term["name"] for term in terms]


def _given_terms(given: Mapping) -> list[str]:
    return [term["name"] for term in given["terms"]]


def _ranges(given: Mapping, key: str) -> list[Hyperparameter]:
    """The accepted values of `loss.<key>` for this loss: its schema field's (for a mix, the field's of every
    term that takes the key, as each term's own schema declares it)."""
    if given["name"] != MIX:
        return [LOSS_SCHEMAS[given["name"]].accepted(key)]
    ranges = [LOSS_SCHEMAS[t].accepted(key) for t in _given_terms(given) if key in LOSSES[t].keys]
    return ranges or [LOSS_SCHEMAS[MIX].accepted(key) or HYPERPARAMETERS[key]]


def _where(name: str, terms: list[str]) -> str:
    return f"loss={name}" + (f" with terms {', '.join(terms)}" if name == MIX else "")


def foreign_key(key: str, name: str, keys: Sequence[str]) -> InvalidConfig:
    """`loss.<key>` given to a loss that has no such hyperparameter (`keys`: the loss's, `name` first)."""
    return InvalidConfig(f"loss.{key}", f"is not a hyperparameter of loss={name}",
                         f"its keys: {', '.join(keys[1:])} (conf/loss/{name}.yaml); leave loss.{key} out "
                         f"(~loss.{key}), or set it only with a loss that has it")


def check_loss_config(given: Mapping) -> None:
    """Refuse an unknown loss, a key that is not this loss's (or one it lacks), and values out of range, in
    `loss.*` as the config gives it (LossConfig.check)."""
    name = given.get("name")  # absent or unknown: refused by its field's setting
    setting_of(_NAME).accepted_values.check(name, "loss.name")
    terms = _check_terms(given.get("terms")) if name == MIX else []
    expected = mix_keys(terms) if name == MIX else LOSSES[name].keys
    where = _where(name, terms)
    extra = [key for key in given if key not in expected]
    missing = [key for key in expected if key not in given]
    if name == MIX and (extra or missing):  # changed terms: say every key to add and to leave out at once
        changes = [f"+loss.{k}=<{_ranges(given, k)[0].accepted}>" for k in missing] + [f"~loss.{k}" for k in extra]
        _refuse("terms", f"{where} has keys {', '.join(expected[1:])}", "these changes: " + " ".join(shlex.quote(c) for c in changes))
    for key in extra:  # added with +loss.<key> (Hydra refuses loss.<key> itself: the loss's schema lacks it)
        raise foreign_key(key, name, expected)
    for key in missing:
        _refuse(key, f"missing: {where} needs it", f"+loss.{key}=<{_ranges(given, key)[0].accepted}>")
    settings = [key for key in expected if key not in ("name", "terms")]
    for key in settings:
        for hp in _ranges(given, key):
            if not hp.check(given[key]):
                _refuse(key, f"got {given[key]!r} for {where}", hp.accepted)
    if name == MIX and given["f_divergence"] != "reverse_kl":
        unfit = [t for t in terms if t not in F_DIVERGENCE_TERMS]
        if unfit:
            _refuse("f_divergence", f"'{given['f_divergence']}' with terms {', '.join(unfit)} (no f-divergence form)",
                    f"reverse_kl, or terms among {', '.join(F_DIVERGENCE_TERMS)}")


# A resolved config's `loss` is read by its loss (Config.of), and its keys are the losses' (Config.loss's choices).
BUILDERS["loss"] = loss_config
CONFIG_LOSS_SCHEMAS.update(LOSS_SCHEMAS)
