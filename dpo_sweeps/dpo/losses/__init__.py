"""Preference losses: `loss=<name>` picks one (conf/loss/<name>.yaml documents it), `loss=mix` a weighted sum.

- pairwise.py: each loss as a pure function over per-sequence log-probs, and `preference_loss`, the
  loss a config names, which the trainer calls;
- registry.py: the table of names, papers, TRL names, references and hyperparameters;
- schema.py: one typed dataclass per loss, made from that table, which Hydra composes `loss.*` into;
- here: what the config says of a loss (its keys, whether it needs a reference, its metrics) and the
  checks validate.py runs. Nothing here loads torch: a sweep validates every point before launch.
Per-token log-probs are computed beside the model (response_logps.py, token_logps.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

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
from dpo_sweeps.dpo.losses.schema import LOSS_SCHEMAS
from dpo_sweeps.errors import InvalidConfig

__all__ = ["LOSSES", "LOSS_SCHEMAS", "MIX", "NAMES", "LossSpec", "check_loss_config", "foreign_key", "ld_alpha_of",
           "loss_keys", "metric_names", "uses_reference"]


def _terms(loss_cfg: Mapping) -> list[str]:
    return [term["name"] for term in loss_cfg["terms"]]


def loss_keys(loss_cfg: Mapping) -> tuple[str, ...]:
    """The keys `loss.*` has for this loss: exactly those of its conf/loss file."""
    return mix_keys(_terms(loss_cfg)) if loss_cfg["name"] == MIX else LOSSES[loss_cfg["name"]].keys


def uses_reference(loss_cfg: Mapping) -> bool:
    """Whether the run needs reference log-probs; when not, no reference is built, scored or cached."""
    if loss_cfg["name"] == MIX:
        needs = any(LOSSES[name].uses_reference for name in _terms(loss_cfg))
    else:
        needs = LOSSES[loss_cfg["name"]].uses_reference
    return needs and not loss_cfg["reference_free"]


def ld_alpha_of(loss_cfg: Mapping) -> float | None:
    """LD-DPO's alpha when this loss takes one and it is set (response_logps weighs the log-probs with it)."""
    return loss_cfg["ld_alpha"] if "ld_alpha" in loss_keys(loss_cfg) else None


def metric_names(loss_cfg: Mapping) -> tuple[str, ...]:
    """The loss's own per-pair metrics, beyond loss, rewards/* and logps/*."""
    if loss_cfg["name"] == MIX:
        return tuple(f"mix/{name}" for name in dict.fromkeys(_terms(loss_cfg)))
    spec = LOSSES[loss_cfg["name"]]
    return spec.metrics + (("nll_loss",) if "sft_weight" in spec.keys and loss_cfg["sft_weight"] > 0 else ())


# ------------------------------------------------------------------ checks (validate.py calls these)
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


def _ranges(loss_cfg: Mapping, key: str) -> list[Hyperparameter]:
    """The accepted values of `loss.<key>` for this loss: its schema field's (for a mix, the field's of every
    term that takes the key, as each term's own schema declares it)."""
    if loss_cfg["name"] != MIX:
        return [LOSS_SCHEMAS[loss_cfg["name"]].accepted(key)]
    ranges = [LOSS_SCHEMAS[t].accepted(key) for t in _terms(loss_cfg) if key in LOSSES[t].keys]
    return ranges or [LOSS_SCHEMAS[MIX].accepted(key) or HYPERPARAMETERS[key]]


def _where(name: str, terms: list[str]) -> str:
    return f"loss={name}" + (f" with terms {', '.join(terms)}" if name == MIX else "")


def foreign_key(key: str, name: str, keys: Sequence[str]) -> InvalidConfig:
    """`loss.<key>` given to a loss that has no such hyperparameter (`keys`: the loss's, `name` first)."""
    return InvalidConfig(f"loss.{key}", f"is not a hyperparameter of loss={name}",
                         f"its keys: {', '.join(keys[1:])} (conf/loss/{name}.yaml); leave loss.{key} out "
                         f"(~loss.{key}), or set it only with a loss that has it")


def check_loss_config(loss_cfg: Mapping) -> None:
    """Refuse an unknown loss, a key that is not this loss's (or one it lacks), and values out of range."""
    name = loss_cfg.get("name")  # absent or unknown: refused just below
    if name not in NAMES:
        _refuse("name", f"unknown loss '{name}'", ", ".join(NAMES))
    if name == MIX:
        _check_terms(loss_cfg.get("terms"))
    expected = loss_keys(loss_cfg)
    where = _where(name, _terms(loss_cfg) if name == MIX else [])
    extra = [key for key in loss_cfg if key not in expected]
    missing = [key for key in expected if key not in loss_cfg]
    if name == MIX and (extra or missing):  # changed terms: say every key to add and to leave out at once
        changes = [f"+loss.{k}=<{_ranges(loss_cfg, k)[0].accepted}>" for k in missing] + [f"~loss.{k}" for k in extra]
        _refuse("terms", f"{where} has keys {', '.join(expected[1:])}", "these changes: " + " ".join(shlex.quote(c) for c in changes))
    for key in extra:  # added with +loss.<key> (Hydra refuses loss.<key> itself: the loss's schema lacks it)
        raise foreign_key(key, name, expected)
    for key in missing:
        _refuse(key, f"missing: {where} needs it", f"+loss.{key}=<{_ranges(loss_cfg, key)[0].accepted}>")
    settings = [key for key in expected if key not in ("name", "terms")]
    for key in settings:
        for hp in _ranges(loss_cfg, key):
            if not hp.check(loss_cfg[key]):
                _refuse(key, f"got {loss_cfg[key]!r} for {where}", hp.accepted)
    if name == MIX and loss_cfg["f_divergence"] != "reverse_kl":
        unfit = [t for t in _terms(loss_cfg) if t not in F_DIVERGENCE_TERMS]
        if unfit:
            _refuse("f_divergence", f"'{loss_cfg['f_divergence']}' with terms {', '.join(unfit)} (no f-divergence form)",
                    f"reverse_kl, or terms among {', '.join(F_DIVERGENCE_TERMS)}")
