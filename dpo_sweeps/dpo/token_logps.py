"""Log-prob kernels: per-token response log-probs (fp32), and their per-sequence sums.

`response_logps.py` runs the model and calls these; the losses (dpo_sweeps/dpo/losses/) only ever see
per-sequence sums and token counts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dpo_sweeps.errors import InvalidConfig


def labelled_token_logps(logits: torch.Tensor, labels: torch.Tensor,
                         ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-prob of every labelled token and the row it belongs to, row by row in position order.

    logits [N, L, V] predict labels shifted by one: position t scores token t+1.
    """
    logits = logits[:, :-1, :].float()
    labels = labels[:, 1:]
    rows, positions = (labels != ignore_index).nonzero(as_tuple=True)
    token_logps = logits[rows, positions].log_softmax(-1).gather(1, labels[rows, positions, None]).squeeze(1)
    return token_logps, rows


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
        fp32 = {"dtype": torch.float32, "device": weight.device}
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

    Equal to `labelled_token_logps` on full logits, up to float rounding, without
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


def length_desensitized_sums(token_logps: torch.Tensor, sequences: torch.Tensor, counts: torch.Tensor,
                             alpha: float) -> torch.Tensor:
    """LD-DPO's log-prob per sequence: the first min(|y_w|, |y_l|) response tokens in full, the rest times alpha.

    Liu et al. 2024, "Length Desensitization in Direct Preference Optimization" (arXiv 2409.06411).
    Sequences are chosen 0..B-1 then rejected B..2B-1; each sequence's tokens come in position order.
    """
    pairs = counts.shape[0] // 2
    shared = torch.minimum(counts[:pairs], counts[pairs:]).repeat(2)
    # Each token's index within its own response: its place after a stable sort by sequence,
    # minus where that sequence starts.
    order = torch.argsort(sequences, stable=True)
    starts = counts.cumsum(0) - counts
    index = torch.empty_like(sequences)
    index[order] = torch.arange(sequences.shape[0], device=sequences.device) - starts[sequences[order]]
    weights = torch.where(index < shared[sequences], 1.0, alpha).to(token_logps.dtype)
    sums = torch.zeros(counts.shape[0], dtype=token_logps.dtype, device=token_logps.device)
    return sums.index_add(0, sequences, token_logps * weights)
