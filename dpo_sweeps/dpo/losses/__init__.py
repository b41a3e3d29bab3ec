"""Preference losses: `loss=<name>` picks one (conf/loss/<name>.yaml documents it), `loss=mix` a weighted sum.

- pairwise.py: each loss as a pure function over per-sequence log-probs, and `preference_loss`, the
  loss a config names, which the trainer calls;
- registry.py: the table of names, papers, TRL names, references and hyperparameters;
- schema.py: one typed dataclass per loss, made from that table, which Hydra composes `loss.*` into,
  and its checks (`check_loss_config`, run by LossConfig.check);
- here: what the config says of a loss (its keys, whether it needs a reference, its metrics). Nothing
  here loads torch: a sweep validates every point before launch.
Per-token log-probs are computed beside the model (response_logps.py, token_logps.py).
"""

from __future__ import annotations

from dpo_sweeps.dpo.losses.registry import LOSSES, MIX, NAMES, LossSpec, mix_keys
from dpo_sweeps.dpo.losses.schema import LOSS_SCHEMAS, LossConfig, check_loss_config, foreign_key, loss_config

__all__ = ["LOSSES", "LOSS_SCHEMAS", "MIX", "NAMES", "LossConfig", "LossSpec", "check_loss_config", "foreign_key",
           "ld_alpha_of", "loss_config", "loss_keys", "metric_names", "uses_reference"]


def _terms(loss: LossConfig) -> list[str]:
    return [term.name for term in loss.terms]


def loss_keys(loss: LossConfig) -> tuple[str, ...]:
    """The keys `loss.*` has for this loss: exactly those of its conf/loss file."""
    return mix_keys(_terms(loss)) if loss.name == MIX else LOSSES[loss.name].keys


def uses_reference(loss: LossConfig) -> bool:
    """Whether the run needs reference log-probs; when not, no reference is built, scored or cached."""
    if loss.name == MIX:
        needs = any(LOSSES[name].uses_reference for name in _terms(loss))
    else:
        needs = LOSSES[loss.name].uses_reference
    return needs and not loss.reference_free


def ld_alpha_of(loss: LossConfig) -> float | None:
    """LD-DPO's alpha when this loss takes one and it is set (response_logps weighs the log-probs with it)."""
    return loss.ld_alpha if "ld_alpha" in loss_keys(loss) else None


def metric_names(loss: LossConfig) -> tuple[str, ...]:
    """The loss's own per-pair metrics, beyond loss, rewards/* and logps/*."""
    if loss.name == MIX:
        return tuple(f"mix/{name}" for name in dict.fromkeys(_terms(loss)))
    spec = LOSSES[loss.name]
    return spec.metrics + (("nll_loss",) if "sft_weight" in spec.keys and loss.sft_weight > 0 else ())
