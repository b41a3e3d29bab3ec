"""The table of `loss=` names: each one's function, paper, TRL name, whether it needs a reference,
and its hyperparameters, each with its type and accepted values. The typed schema of every loss
(schema.py: one dataclass per loss, made from this table), validation, the documentation and the
report all read this one table. Functions are named here, not imported: a sweep's own process validates
every point with this table before launch and never needs torch (pairwise.py holds the functions).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Hyperparameter:
    """A `loss.*` key: its type (the schema's field type, which Hydra enforces) and its accepted values."""

    type: Any
    accepted: str  # what an error message says is accepted
    check: Callable[[Any], bool]


def _between(low: float | None, high: float | None, *, low_open: bool = False, high_open: bool = False,
             typical: str = "") -> Hyperparameter:
    def check(v):
        return (_number(v) and (low is None or (v > low if low_open else v >= low))
                and (high is None or (v < high if high_open else v <= high)))
    lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
    hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
    text = f"a number in {lo}, {hi}" if low is not None and high is not None else f"a number {'>' if low_open else '>='} {low:g}"
    return Hyperparameter(float, text + (f" (typical: {typical})" if typical else ""), check)


def _one_of(*choices: str) -> Hyperparameter:
    return Hyperparameter(str, ", ".join(choices), lambda v: v in choices)


BOOLEAN = Hyperparameter(bool, "true or false", lambda v: isinstance(v, bool))
BETA = _between(0, None, low_open=True, typical="0.01 to 0.5; SimPO 2 to 10")
SMOOTHING = _between(0, 0.5, high_open=True, typical="0 to 0.2")
F_DIVERGENCES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")

HYPERPARAMETERS: dict[str, Hyperparameter] = {
    "beta": BETA,
    "label_smoothing": SMOOTHING,
    "length_normalized": BOOLEAN,
    "discopop_tau": _between(0, None, low_open=True, typical="0.05"),
    "gamma": _between(0, None, typical="0.5 to 1.5"),
    "reference_free": BOOLEAN,
    "sft_weight": _between(0, None, typical="0 to 1"),
    "nll_average": _one_of("sequence", "batch"),
    "ld_alpha": Hyperparameter(float | None, "null, or a number in [0, 1] (typical: 0.2 to 0.6)",
                               lambda v: v is None or (_number(v) and 0 <= v <= 1)),
    "f_divergence": _one_of(*F_DIVERGENCES),
    "f_alpha_divergence_coef": _between(0, None, low_open=True, typical="0.3 to 0.9"),
}
# EXO's eps is a target probability: log eps and log(1 - eps) must exist.
EXO_SMOOTHING = _between(0, 1, low_open=True, high_open=True, typical="1e-3")

# Groups of keys that come with a kind of loss.
REFERENCE = ("reference_free",)  # a loss that compares with a reference can take a uniform one instead
NLL = ("sft_weight", "nll_average")  # + sft_weight x NLL(chosen): RPO (Pang et al. 2024, arXiv 2404.19733)
LD = ("ld_alpha",)  # LD-DPO's weighting of the log-probs, as TRL's DPOTrainer applies it to all its losses
F_DIVERGENCE = ("f_divergence", "f_alpha_divergence_coef")


@dataclass(frozen=True)
class LossSpec:
    name: str
    function_name: str  # its function in pairwise.py
    paper: str
    trl_name: str  # how TRL 1.16 names it (DPOTrainer loss_type unless said otherwise)
    uses_reference: bool
    own: tuple[str, ...]  # its own hyperparameters, in the order its conf/loss file lists them
    modifiers: tuple[str, ...]  # the keys of REFERENCE / NLL / LD / F_DIVERGENCE it takes
    metrics: tuple[str, ...] = ()  # its own per-pair metrics, logged as train/<m> and eval/<m>
    ranges: tuple[tuple[str, Hyperparameter], ...] = ()  # a range of its own for a shared key

    @property
    def keys(self) -> tuple[str, ...]:
        return ("name",) + self.own + self.modifiers

    @property
    def function(self) -> Callable[..., Any]:
        """pairwise.<function_name>: (PairLogps, loss config) -> LossTerms."""
        return getattr(importlib.import_module("dpo_sweeps.dpo.losses.pairwise"), self.function_name)

    def hyperparameter(self, key: str) -> Hyperparameter:
        return dict(self.ranges).get(key, HYPERPARAMETERS.get(key))


def _spec(name, function, paper, trl_name, own=("beta",), *, reference=True, nll=True, ld=True, f_div=False,
          metrics=(), ranges=()):
    modifiers = ((REFERENCE if reference else ()) + (NLL if nll else ()) + (LD if ld else ())
                 + (F_DIVERGENCE if f_div else ()))
    return LossSpec(name, function, paper, trl_name, reference, tuple(own), modifiers, tuple(metrics), tuple(ranges))


SPECS = (
    _spec("dpo", "dpo", "Rafailov et al. 2023 (2305.18290); cDPO, Mitchell 2023", "sigmoid (at label_smoothing 0)",
          ("beta", "label_smoothing"), f_div=True),
    _spec("sigmoid", "sigmoid", "Rafailov et al. 2023 (2305.18290)", "sigmoid", f_div=True),
    _spec("hinge", "hinge", "SLiC, Zhao et al. 2023 (2305.10425)", "hinge", f_div=True),
    _spec("ipo", "ipo", "Azar et al. 2023 (2310.12036)", "ipo (length_normalized: true)",
          ("beta", "length_normalized"), f_div=True, metrics=("ipo/gap",)),
    _spec("exo_pair", "exo_pair", "EXO, Ji et al. 2024 (2402.00856)", "exo_pair", ("beta", "label_smoothing"),
          f_div=True, ranges=(("label_smoothing", EXO_SMOOTHING),)),
    _spec("nca_pair", "nca_pair", "NCA, Chen et al. 2024 (2402.05369)", "nca_pair"),
    _spec("robust", "robust", "Robust DPO, Chowdhury et al. 2024 (2403.00409)", "robust",
          ("beta", "label_smoothing"), f_div=True),
    _spec("bco_pair", "bco_pair", "BCO, Jung et al. 2024 (2404.04656)", "bco_pair"),
    _spec("sppo_hard", "sppo_hard", "SPPO, Wu et al. 2024 (2405.00675)", "sppo_hard"),
    _spec("aot", "aot", "AOT, Melnyk et al. 2024 (2406.05882)", "aot", ("beta", "label_smoothing")),
    _spec("aot_unpaired", "aot_unpaired", "AOT, Melnyk et al. 2024 (2406.05882)", "aot_unpaired",
          ("beta", "label_smoothing")),
    _spec("apo_zero", "apo_zero", "APO, D'Oosterlinck et al. 2024 (2408.06266)", "apo_zero"),
    _spec("apo_down", "apo_down", "APO, D'Oosterlinck et al. 2024 (2408.06266)", "apo_down"),
    _spec("discopop", "discopop", "DiscoPOP, Chris Lu et al. 2024 (2406.08414)", "discopop",
          ("beta", "discopop_tau"), f_div=True),
    _spec("sigmoid_norm", "sigmoid_norm", "DPO on per-token mean log-ratios (TRL)", "sigmoid_norm", f_div=True),
    _spec("sft", "sft", "NLL of the chosen responses", "sft (nll_average: batch)", ("beta", "nll_average"),
          reference=False, nll=False, ld=False),
    _spec("simpo", "simpo", "SimPO, Meng et al. 2024 (2405.14734)", "CPOTrainer loss_type=simpo, cpo_alpha=sft_weight",
          ("beta", "gamma"), reference=False, ld=False, metrics=("simpo/margin_minus_gamma",)),
    _spec("orpo", "orpo", "ORPO, Hong et al. 2024 (2403.07691)", "ORPOTrainer (nll_average: batch)",
          ("beta", "nll_average"), reference=False, nll=False, ld=False,
          metrics=("orpo/log_odds_ratio", "orpo/log_odds_chosen", "orpo/nll_loss")),
    _spec("rso", "rso", "RSO, Liu et al. 2023 (2309.06657)", "hinge"),
    _spec("rpo", "sigmoid", "RPO, Pang et al. 2024 (2404.19733)", "[sigmoid, sft], loss_weights [1, sft_weight]",
          f_div=True),
    _spec("f_dpo", "sigmoid", "f-DPO, Wang et al. 2023 (2309.16240)", "sigmoid with f_divergence_type", f_div=True),
    _spec("ld_dpo", "sigmoid", "LD-DPO, Liu et al. 2024 (2409.06411)", "sigmoid with ld_alpha", f_div=True),
)
LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in SPECS}

# `loss=mix`: a weighted sum of TRL's loss types, as DPOTrainer's loss_type list with loss_weights.
MIX = "mix"
MIX_TERMS = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
             "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")
# Terms that accept an f-divergence in TRL (sft ignores it).
F_DIVERGENCE_TERMS = tuple(n for n in MIX_TERMS if "f_divergence" in LOSSES[n].keys) + ("sft",)
NAMES = tuple(LOSSES) + (MIX,)


def mix_keys(term_names: list[str]) -> tuple[str, ...]:
    """`loss=mix`'s keys: those of conf/loss/mix.yaml, and the terms' own hyperparameters (shared, as TRL
    shares them: one label_smoothing for robust and aot)."""
    keys = ["name", "terms", "beta", "reference_free", "ld_alpha", "f_divergence", "f_alpha_divergence_coef",
            "nll_average"]
    for term in term_names:
        keys += [key for key in LOSSES[term].own if key not in keys]
    return tuple(keys)
