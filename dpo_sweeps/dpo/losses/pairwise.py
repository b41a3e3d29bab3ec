"""The preference losses, one small pure function each, over per-sequence response log-probs.

Every function takes the pairs' log-probs (`PairLogps`: summed over each response's tokens, with
token counts for the length-normalised ones) and the loss config (`hp`: `loss.*`), and returns the
per-pair loss, the implicit rewards and the loss's own per-pair metrics. Which function a `loss=`
name runs, its hyperparameters and their accepted values are in registry.py; `preference_loss` (at
the end) runs the one a config names.

Notation: pi_w, pi_l the policy's log-probs of the chosen (w) and rejected (l) response, ref_w,
ref_l the reference's; the log-ratios r_w = pi_w - ref_w, r_l = pi_l - ref_l; the scores s_w, s_l
are the log-ratios under the f-divergence (`loss.f_divergence`; reverse KL: s = r); d = s_w - s_l.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from dpo_sweeps.dpo.losses.registry import LOSSES, MIX
from dpo_sweeps.dpo.losses.schema import LossConfig


@dataclass
class PairLogps:
    """One micro-batch's response log-probs, per pair ([B] each), fp32."""

    chosen: torch.Tensor  # policy, as the loss scores them (LD-DPO weighted under loss.ld_alpha)
    rejected: torch.Tensor
    ref_chosen: torch.Tensor | None  # None: the loss takes no reference
    ref_rejected: torch.Tensor | None
    chosen_tokens: torch.Tensor  # response token counts
    rejected_tokens: torch.Tensor
    chosen_nll_sums: torch.Tensor  # plain summed chosen log-probs, for the NLL term

    @classmethod
    def split(cls, logps: torch.Tensor, counts: torch.Tensor, nll_sums: torch.Tensor,
              reference: torch.Tensor | None) -> PairLogps:
        """From per-sequence values [2B], chosen sequences then rejected, as response_logps gives them."""
        n = logps.shape[0] // 2
        ref_chosen, ref_rejected = (None, None) if reference is None else (reference[:n], reference[n:])
        return cls(logps[:n], logps[n:], ref_chosen, ref_rejected, counts[:n], counts[n:], nll_sums[:n])

    def logratios(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.chosen - self.ref_chosen, self.rejected - self.ref_rejected

    def mean_logps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Length-normalised (per-token mean) policy log-probs."""
        return self.chosen / self.chosen_tokens.clamp(min=1), self.rejected / self.rejected_tokens.clamp(min=1)


@dataclass
class LossTerms:
    losses: torch.Tensor  # [B], with grad
    chosen_rewards: torch.Tensor  # [B], detached
    rejected_rewards: torch.Tensor  # [B], detached
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # "<loss>/<name>" -> [B], detached


def _dpo_rewards(x: PairLogps, hp: LossConfig, losses: torch.Tensor, **metrics: torch.Tensor) -> LossTerms:
    """Implicit rewards beta (pi - ref), as the DPO paper (eq. 5) and TRL log them for every reference loss."""
    r_w, r_l = x.logratios()
    return LossTerms(losses, (hp.beta * r_w).detach(), (hp.beta * r_l).detach(),
                     {k: v.detach() for k, v in metrics.items()})


def scores(x: PairLogps, hp: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """s = f'(pi/ref) of the f-divergence regulariser (Wang et al. 2023, f-DPO, arXiv 2309.16240, table 1)."""
    r_w, r_l = x.logratios()
    kind = hp.f_divergence
    if kind == "reverse_kl":
        return r_w, r_l
    if kind == "forward_kl":  # f'(u) = 1 - 1/u
        return 1 - torch.exp(-r_w), 1 - torch.exp(-r_l)
    if kind == "js_divergence":  # f'(u) = log(2u / (1 + u))
        return math.log(2) + F.logsigmoid(r_w), math.log(2) + F.logsigmoid(r_l)
    alpha = hp.f_alpha_divergence_coef  # alpha_divergence: f'(u) = (u^(alpha-1) - 1) / (alpha - 1)
    if abs(alpha - 1) < 1e-6:
        return r_w, r_l  # the limit alpha -> 1 is reverse KL
    # exp's argument capped at 80 (fp32 stays finite), as TRL does.
    return tuple((torch.exp(((alpha - 1) * r).clamp(max=80.0)) - 1) / (alpha - 1) for r in (r_w, r_l))


def _delta(x: PairLogps, hp: LossConfig) -> torch.Tensor:
    s_w, s_l = scores(x, hp)
    return s_w - s_l


def _normalised_delta(x: PairLogps, hp: LossConfig) -> torch.Tensor:
    s_w, s_l = scores(x, hp)
    return s_w / x.chosen_tokens.clamp(min=1) - s_l / x.rejected_tokens.clamp(min=1)


def _conservative_sigmoid(z: torch.Tensor, eps: float) -> torch.Tensor:
    """-log sigmoid(z) (1 - eps) - log sigmoid(-z) eps: cDPO (Mitchell 2023), plain DPO at eps = 0."""
    return -F.logsigmoid(z) * (1 - eps) - F.logsigmoid(-z) * eps


# ------------------------------------------------------------------ reference losses (TRL's loss types)
def sigmoid(x, hp):
    """DPO: -log sigmoid(beta d) (Rafailov et al. 2023, arXiv 2305.18290, eq. 7)."""
    return _dpo_rewards(x, hp, -F.logsigmoid(hp.beta * _delta(x, hp)))


def dpo(x, hp):
    """DPO with label smoothing eps: cDPO (Mitchell 2023); eps = 0 is `sigmoid`."""
    return _dpo_rewards(x, hp, _conservative_sigmoid(hp.beta * _delta(x, hp), hp.label_smoothing))


def hinge(x, hp):
    """SLiC: max(0, 1 - beta d) (Zhao et al. 2023, arXiv 2305.10425, eq. 3, delta = 1/beta)."""
    return _dpo_rewards(x, hp, torch.relu(1 - hp.beta * _delta(x, hp)))


def ipo(x, hp):
    """IPO: (d - 1/(2 beta))^2 (Azar et al. 2023, arXiv 2310.12036, eq. 17).

    d on summed log-probs as the reference DPO implementation; `length_normalized` divides each
    score by its response's token count first, as TRL does.
    """
    d = _normalised_delta(x, hp) if hp.length_normalized else _delta(x, hp)
    gap = d - 1 / (2 * hp.beta)
    return _dpo_rewards(x, hp, gap**2, **{"ipo/gap": gap})


def exo_pair(x, hp):
    """EXO-pref: KL(softmax(beta d) || (1 - eps, eps)) over the pair (Ji et al. 2024, arXiv 2402.00856, eq. 16)."""
    z, eps = hp.beta * _delta(x, hp), hp.label_smoothing
    losses = (torch.sigmoid(z) * (F.logsigmoid(z) - math.log1p(-eps))
              + torch.sigmoid(-z) * (F.logsigmoid(-z) - math.log(eps)))
    return _dpo_rewards(x, hp, losses)


def nca_pair(x, hp):
    """NCA: -log sigmoid(beta r_w) - (log sigmoid(-beta r_w) + log sigmoid(-beta r_l)) / 2 (Chen et al. 2024, arXiv 2402.05369)."""
    r_w, r_l = x.logratios()
    b = hp.beta
    return _dpo_rewards(x, hp, -F.logsigmoid(b * r_w) - 0.5 * F.logsigmoid(-b * r_w) - 0.5 * F.logsigmoid(-b * r_l))


def robust(x, hp):
    """Robust DPO for labels flipped with probability eps (Chowdhury et al. 2024, arXiv 2403.00409):
    ((1 - eps)(-log sigmoid(beta d)) - eps(-log sigmoid(-beta d))) / (1 - 2 eps)."""
    z, eps = hp.beta * _delta(x, hp), hp.label_smoothing
    return _dpo_rewards(x, hp, (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps))


def bco_pair(x, hp):
    """BCO on pairs, without the running reward shift: -log sigmoid(beta r_w) - log sigmoid(-beta r_l)
    (Jung et al. 2024, arXiv 2404.04656)."""
    r_w, r_l = x.logratios()
    return _dpo_rewards(x, hp, -F.logsigmoid(hp.beta * r_w) - F.logsigmoid(-hp.beta * r_l))


def sppo_hard(x, hp):
    """SPPO with hard win probabilities: (r_w - 1/(2 beta))^2 + (r_l + 1/(2 beta))^2 (Wu et al. 2024, arXiv 2405.00675, eq. 4.7)."""
    r_w, r_l = x.logratios()
    half = 0.5 / hp.beta
    return _dpo_rewards(x, hp, (r_w - half) ** 2 + (r_l + half) ** 2)


def aot(x, hp):
    """AOT, paired: cDPO on sorted(pi_w - pi_l) - sorted(ref_w - ref_l) over the micro-batch
    (Melnyk et al. 2024, arXiv 2406.05882)."""
    policy, _ = torch.sort(x.chosen - x.rejected)
    reference, _ = torch.sort(x.ref_chosen - x.ref_rejected)
    return _dpo_rewards(x, hp, _conservative_sigmoid(hp.beta * (policy - reference), hp.label_smoothing))


def aot_unpaired(x, hp):
    """AOT, unpaired: cDPO on sorted(r_w) - sorted(r_l) over the micro-batch (Melnyk et al. 2024, arXiv 2406.05882)."""
    r_w, r_l = x.logratios()
    d = torch.sort(r_w).values - torch.sort(r_l).values
    return _dpo_rewards(x, hp, _conservative_sigmoid(hp.beta * d, hp.label_smoothing))


def apo_zero(x, hp):
    """APO-zero: 1 - sigmoid(beta r_w) + sigmoid(beta r_l) (D'Oosterlinck et al. 2024, arXiv 2408.06266, eq. 7)."""
    r_w, r_l = x.logratios()
    return _dpo_rewards(x, hp, 1 - torch.sigmoid(hp.beta * r_w) + torch.sigmoid(hp.beta * r_l))


def apo_down(x, hp):
    """APO-down: sigmoid(beta r_w) + 1 - sigmoid(beta (r_w - r_l)) (D'Oosterlinck et al. 2024, arXiv 2408.06266, eq. 8)."""
    r_w, r_l = x.logratios()
    return _dpo_rewards(x, hp, torch.sigmoid(hp.beta * r_w) + 1 - torch.sigmoid(hp.beta * (r_w - r_l)))


def discopop(x, hp):
    """DiscoPOP, the log-ratio modulated loss (Chris Lu et al. 2024, arXiv 2406.08414, eq. 5), z = beta d:
    (1 - sigmoid(z / tau)) (-log sigmoid(z)) + sigmoid(z / tau) exp(-z)."""
    z = hp.beta * _delta(x, hp)
    mix = torch.sigmoid(z / hp.discopop_tau)
    return _dpo_rewards(x, hp, -F.logsigmoid(z) * (1 - mix) + torch.exp(-z) * mix)


def sigmoid_norm(x, hp):
    """DPO on length-normalised scores: -log sigmoid(beta (s_w/|y_w| - s_l/|y_l|)) (TRL's sigmoid_norm)."""
    return _dpo_rewards(x, hp, -F.logsigmoid(hp.beta * _normalised_delta(x, hp)))


# ------------------------------------------------------------------ reference-free losses
def nll(x: PairLogps, average: str) -> torch.Tensor:
    """Negative log-likelihood of the chosen response per pair.

    sequence: each response's per-token mean (every pair weighs the same); batch: the micro-batch's
    token mean, as TRL's sft term (a pair weighs by its length; the mean over pairs is that token mean).
    """
    if average == "sequence":
        return -x.chosen_nll_sums / x.chosen_tokens.clamp(min=1)
    return -x.chosen_nll_sums * x.chosen_tokens.shape[0] / x.chosen_tokens.sum().clamp(min=1)


def sft(x, hp):
    """Supervised fine-tuning on the chosen responses: their NLL (`nll_average`)."""
    return _dpo_rewards(x, hp, nll(x, hp.nll_average))


def simpo(x, hp):
    """SimPO: -log sigmoid(beta (pi_w/|y_w| - pi_l/|y_l|) - gamma) (Meng et al. 2024, arXiv 2405.14734, eq. 6).

    Rewards are beta times the mean log-probs, the paper's reward (eq. 4).
    """
    mean_w, mean_l = x.mean_logps()
    margin = hp.beta * (mean_w - mean_l) - hp.gamma
    return LossTerms(-F.logsigmoid(margin), (hp.beta * mean_w).detach(), (hp.beta * mean_l).detach(),
                     {"simpo/margin_minus_gamma": margin.detach()})


def _log1mexp(v: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(v)) for v < 0, accurate at both ends (Maechler 2012)."""
    return torch.where(v > -math.log(2), torch.log(-torch.expm1(v)), torch.log1p(-torch.exp(v)))


def orpo(x, hp):
    """ORPO: NLL(y_w) - lambda log sigmoid(log odds(y_w) - log odds(y_l)), odds(y) = P(y)/(1 - P(y)) with
    P the per-token mean probability (Hong et al. 2024, arXiv 2403.07691, eqs. 4 and 7; lambda is `beta`)."""
    mean_w, mean_l = x.mean_logps()
    log_odds = (mean_w - mean_l) - (_log1mexp(mean_w) - _log1mexp(mean_l))
    ratio = F.logsigmoid(log_odds)
    nll_loss = nll(x, hp.nll_average)
    return LossTerms(nll_loss - hp.beta * ratio, (hp.beta * mean_w).detach(), (hp.beta * mean_l).detach(),
                     {"orpo/log_odds_ratio": ratio.detach(), "orpo/log_odds_chosen": log_odds.detach(),
                      "orpo/nll_loss": nll_loss.detach()})


def rso(x, hp):
    """RSO's loss: the hinge max(0, 1 - beta (r_w - r_l)) on pairs drawn by statistical rejection sampling
    (Liu et al. 2023, arXiv 2309.06657; the sampling is the data's, not the loss's)."""
    r_w, r_l = x.logratios()
    return _dpo_rewards(x, hp, torch.relu(1 - hp.beta * (r_w - r_l)))


# ------------------------------------------------------------------ the loss a config names
def preference_loss(loss: LossConfig, x: PairLogps) -> LossTerms:
    """Per-pair losses, rewards and metrics of `loss` on one micro-batch; the mean over pairs is the loss."""
    if x.ref_chosen is None:  # no reference: a uniform one (log-probs 0), so rewards are beta * policy log-probs
        x = replace(x, ref_chosen=torch.zeros_like(x.chosen), ref_rejected=torch.zeros_like(x.rejected))
    if loss.name == MIX:
        return _mix(loss, x)
    spec = LOSSES[loss.name]
    out = spec.function(x, loss)
    if "sft_weight" in spec.keys and loss.sft_weight > 0:
        nll_loss = nll(x, loss.nll_average)
        out.losses = out.losses + loss.sft_weight * nll_loss
        out.metrics["nll_loss"] = nll_loss.detach()
    return out


def _mix(loss: LossConfig, x: PairLogps) -> LossTerms:
    """sum_k weight_k loss_k, the terms sharing the hyperparameters (TRL's loss_type list with loss_weights)."""
    total, metrics = 0.0, {}
    for term in loss.terms:
        out = LOSSES[term.name].function(x, loss)
        total = total + term.weight * out.losses
        metrics[f"mix/{term.name}"] = out.losses.detach()
    r_w, r_l = x.logratios()
    beta = loss.beta
    return LossTerms(total, (beta * r_w).detach(), (beta * r_l).detach(), metrics)
