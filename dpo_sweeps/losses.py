"""Preference losses on summed response log-probs, as in the reference DPO implementation.

With h = (log pi(y_w|x) - log pi(y_l|x)) - (log ref(y_w|x) - log ref(y_l|x)) per pair:
- dpo:   -log sigmoid(beta h) (1 - eps) - log sigmoid(-beta h) eps     Rafailov et al. 2023
         (arXiv 2305.18290, eq. 7); eps = label_smoothing > 0 is conservative DPO (Mitchell 2023).
- ipo:   (h - 1 / (2 beta))^2                                          Azar et al. 2023
         (arXiv 2310.12036, eq. 17), on summed log-probs as the reference implementation.
- hinge: max(0, 1 - beta h)                                            SLiC, Zhao et al. 2023
         (arXiv 2305.10425, eq. 3, with delta = 1/beta scaled by beta).
- sft:   mean negative log-likelihood per response token of the chosen answer.
Implicit rewards are beta (log pi - log ref), detached. `reference_free` uses a uniform reference
(ref log-probs = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dpo_sweeps.errors import InvalidConfig

LOSSES = ("dpo", "ipo", "hinge", "sft")


@dataclass
class PreferenceLoss:
    losses: torch.Tensor  # [B], per pair
    chosen_rewards: torch.Tensor  # [B], detached
    rejected_rewards: torch.Tensor  # [B], detached


def check_loss_config(name: str, beta: float, label_smoothing: float) -> None:
    if name not in LOSSES:
        raise InvalidConfig("loss.name", f"unknown loss '{name}'", ", ".join(LOSSES))
    if not isinstance(beta, (int, float)) or beta <= 0:
        raise InvalidConfig("loss.beta", f"got {beta!r}", "a number > 0 (typical: 0.01 to 0.5)")
    if not 0 <= label_smoothing < 0.5:
        raise InvalidConfig("loss.label_smoothing", f"got {label_smoothing!r}", "a number in [0, 0.5)")


def preference_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor | None,
    reference_rejected_logps: torch.Tensor | None,
    *,
    name: str,
    beta: float,
    label_smoothing: float = 0.0,
) -> PreferenceLoss:
    """Per-pair dpo / ipo / hinge losses; reference log-probs None means reference-free."""
    if reference_chosen_logps is None or reference_rejected_logps is None:
        reference_chosen_logps = torch.zeros_like(policy_chosen_logps)
        reference_rejected_logps = torch.zeros_like(policy_rejected_logps)
    h = (policy_chosen_logps - policy_rejected_logps) - (reference_chosen_logps - reference_rejected_logps)
    if name == "dpo":
        losses = -F.logsigmoid(beta * h) * (1 - label_smoothing) - F.logsigmoid(-beta * h) * label_smoothing
    elif name == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    elif name == "hinge":
        losses = torch.relu(1 - beta * h)
    else:
        raise InvalidConfig("loss.name", f"'{name}' is not a preference loss", "dpo, ipo, hinge")
    return PreferenceLoss(
        losses=losses,
        chosen_rewards=(beta * (policy_chosen_logps - reference_chosen_logps)).detach(),
        rejected_rewards=(beta * (policy_rejected_logps - reference_rejected_logps)).detach(),
    )


def sft_loss(chosen_logps_sum: torch.Tensor, chosen_token_counts: torch.Tensor) -> torch.Tensor:
    """Per-pair mean negative log-likelihood of the chosen response's tokens."""
    return -chosen_logps_sum / chosen_token_counts.clamp(min=1)


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs of each row's labelled tokens, in fp32, and the number of those tokens.

    logits [N, L, V] predict labels shifted by one: position t scores token t+1.
    """
    logits = logits[:, :-1, :].float()
    labels = labels[:, 1:]
    mask = labels != ignore_index
    safe_labels = labels.masked_fill(~mask, 0)
    token_logps = torch.gather(logits.log_softmax(-1), 2, safe_labels.unsqueeze(-1)).squeeze(-1)
    return (token_logps * mask).sum(-1), mask.sum(-1)


class _ChunkedTokenLogps(torch.autograd.Function):
    """log softmax(h W^T + b)[target] per row of h, holding at most `chunk_size` rows of logits.

    Forward keeps only h (the rows that score a response token, not every position); backward
    recomputes each chunk's logits and uses d log p_t / d logits = onehot(t) - softmax(logits). One
    extra projection per chunk buys never materialising the [N, L, V] fp32 logits, their log-softmax
    or their gradient (the idea of fused linear cross-entropy kernels, e.g. Liger's).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_size):
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk_size):
            logits = F.linear(hidden[s : s + chunk_size], weight, bias).float()
            picked = logits.gather(1, targets[s : s + chunk_size, None]).squeeze(1)
            out[s : s + chunk_size] = picked - logits.logsumexp(-1)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets = ctx.saved_tensors
        chunk_size = ctx.chunk_size
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        fp32 = dict(dtype=torch.float32, device=weight.device)
        grad_weight = torch.zeros(weight.shape, **fp32) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros(weight.shape[0], **fp32) if bias is not None and ctx.needs_input_grad[2] else None
        for s in range(0, hidden.shape[0], chunk_size):
            h = hidden[s : s + chunk_size]
            # d out / d logits = onehot - softmax, scaled by the incoming gradient.
            d_logits = F.linear(h, weight, bias).float().softmax(-1).neg_()
            d_logits.scatter_add_(1, targets[s : s + chunk_size, None], torch.ones_like(d_logits[:, :1]))
            d_logits.mul_(grad_out[s : s + chunk_size, None])
            if grad_hidden is not None:
                grad_hidden[s : s + chunk_size] = d_logits.to(weight.dtype) @ weight
            if grad_weight is not None:
                grad_weight.addmm_(d_logits.t(), h.float())
            if grad_bias is not None:
                grad_bias += d_logits.sum(0)
        return (grad_hidden, grad_weight.to(weight.dtype) if grad_weight is not None else None,
                grad_bias.to(bias.dtype) if grad_bias is not None else None, None, None)


def chunked_token_logps(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        targets: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """fp32 log-prob of each target under the LM head (weight [V, d], bias [V]) applied to hidden [M, d].

    Equal to `sequence_logps`'s log_softmax-and-gather on full logits, up to float rounding, without
    the [M, V] logits ever existing at once beyond `chunk_size` rows.
    """
    if chunk_size < 1:
        raise InvalidConfig("train.logps_chunk_size", f"got {chunk_size!r}", "an integer >= 1, or 0 for full logits")
    return _ChunkedTokenLogps.apply(hidden, weight, bias, targets, chunk_size)


def sum_by_sequence(token_logps: torch.Tensor, sequences: torch.Tensor,
                    num_sequences: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs and token counts per sequence, from per-token values and their sequence ids."""
    sums = torch.zeros(num_sequences, dtype=token_logps.dtype, device=token_logps.device)
    sums = sums.index_add(0, sequences, token_logps)
    counts = torch.zeros(num_sequences, dtype=torch.long, device=sequences.device).index_add(
        0, sequences, torch.ones_like(sequences))
    return sums, counts
