"""The typed schema of `loss.*`: one dataclass per loss, made from the registry's table.

Each `loss=NAME` has exactly the keys of conf/loss/NAME.yaml: `name`, its own hyperparameters and the
modifiers it takes (registry.py says which). The dataclass of each is made here from that table and
stored in Hydra's ConfigStore as `schema/loss/NAME`; conf/config.yaml's defaults list types the chosen
loss with it (`schema/loss@loss: ${loss}`), so Hydra refuses a key the loss does not have
(`loss.gamma=0.5` with loss=sigmoid) and a value of the wrong type (`loss.beta=abc`) while composing.
Every field carries its accepted values (`Hyperparameter`, the registry's) beside its type:
`LossConfig.check` and the grid check before launch read them there.

Values and their documentation live in conf/loss/NAME.yaml, once: that file is what a user reads to
learn a loss (its paper, formula and each key's meaning) and what a sweep overrides, as every other
group of conf/ chooses the values of its schema. The fields here are MISSING until it sets them.

`loss=mix` is the one loss whose keys depend on its settings: its terms bring their own hyperparameters
(`+loss.label_smoothing=0.1` for a robust term). Its dataclass types the keys every mix has, `terms` a
list of typed `MixTerm`s; the terms' own keys are checked against the terms by `check_loss_config`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from dpo_sweeps.dpo.losses.registry import HYPERPARAMETERS, LOSSES, MIX, Hyperparameter, LossSpec, mix_keys

# A field's metadata key for its accepted values (a registry Hyperparameter).
ACCEPTED = "accepted"


def hyperparameter(hp: Hyperparameter) -> Any:
    """A loss field: MISSING until its conf/loss file sets it, with its accepted values beside it."""
    return field(default=MISSING, metadata={ACCEPTED: hp})


@dataclass
class LossConfig:
    """`loss.*` of one loss: `name` and exactly its hyperparameters (a subclass per loss, LOSS_SCHEMAS)."""

    name: str = MISSING
    """The conf/loss file chosen (`loss=NAME`), as the registry names it."""

    @classmethod
    def accepted(cls, key: str) -> Hyperparameter | None:
        return next((f.metadata.get(ACCEPTED) for f in fields(cls) if f.name == key), None)


@dataclass
class MixTerm:
    """One term of `loss=mix`: a TRL loss type and its weight in the sum."""

    name: str = MISSING
    """A loss of registry.MIX_TERMS."""
    weight: float = MISSING
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
        [(key, _field_type(spec.hyperparameter(key)), hyperparameter(spec.hyperparameter(key))) for key in keys],
        bases=(LossConfig,),
        namespace={"__module__": __name__, "__doc__": f"`loss={spec.name}`: {spec.paper} (conf/loss/{spec.name}.yaml)."},
    )


def _mix_schema() -> type[LossConfig]:
    """`loss=mix`: the keys every mix has (conf/loss/mix.yaml), `terms` typed term by term."""
    shared = [key for key in mix_keys([]) if key not in ("name", "terms")]
    return make_dataclass(
        "MixLoss",
        [("terms", list[MixTerm], field(default=MISSING))]
        + [(key, _field_type(HYPERPARAMETERS[key]), hyperparameter(HYPERPARAMETERS[key])) for key in shared],
        bases=(LossConfig,),
        namespace={"__module__": __name__, "__doc__": "`loss=mix`: a weighted sum of TRL loss types (conf/loss/mix.yaml)."},
    )


LOSS_SCHEMAS: dict[str, type[LossConfig]] = {name: _schema_of(spec) for name, spec in LOSSES.items()}
LOSS_SCHEMAS[MIX] = _mix_schema()


def register() -> None:
    """Store each loss's dataclass as `schema/loss/NAME` (idempotent); conf/config.yaml types `loss` with it."""
    store = ConfigStore.instance()
    for name, node in LOSS_SCHEMAS.items():
        store.store(group="schema/loss", name=name, node=node)
