"""How the step, the evaluation and the reference pass score pairs: a collated micro-batch (padded, or
packed under train.packing), and its response log-probs as the loss takes them."""

from __future__ import annotations

from typing import Any

import torch

from dpo_sweeps.config.schema import Config
from dpo_sweeps.data.collate import collate
from dpo_sweeps.data.encoding import EncodedPair, pair_tokens
from dpo_sweeps.data.packing import collate_packed, packed_step, row_budget, widest_segment
from dpo_sweeps.dpo.losses import ld_alpha_of
from dpo_sweeps.dpo.response_logps import response_logps

# A batch's counts, read on the host (by the step's accounting and to size the per-sequence sums): they
# stay on the CPU, so that reading them never waits for the device.
COUNTS = ("num_tokens", "num_row_tokens", "num_pairs")


def collate_pairs(pairs: list[EncodedPair], tokenizer: Any, cfg: Config) -> dict[str, torch.Tensor]:
    train = cfg.train
    if train.packing:
        return collate_packed(pairs, tokenizer.pad_token_id, row_tokens=row_tokens(pairs, cfg),
                              share_prompt=train.share_prompt)
    return collate(pairs, tokenizer.pad_token_id, share_prompt=train.share_prompt)


def row_tokens(pairs: list[EncodedPair], cfg: Config) -> int:
    """The packed rows' budget for these pairs (data/packing.py `row_budget`)."""
    return row_budget(cfg, widest_segment(pairs, share_prompt=cfg.train.share_prompt))


def training_micro_batches(micro_batches: list[list[EncodedPair]], cfg: Config) -> list[list[EncodedPair]]:
    """A rank's step as it trains: the padded micro-batches, or, packed with a shared prompt, the step's
    pairs regrouped into as many micro-batches of whole packed rows (data/packing.py `packed_step`), so rows
    fill across the step rather than within each group of train.micro_batch_size pairs. The count stays, so
    every rank runs as many forwards and backwards (FSDP's collectives need that); the pairs and their loss
    (summed over the step) stay too.

    With prompts apart, chosen and rejected are two segments that must share a micro-batch (the loss pairs
    them there), so each micro-batch is packed on its own, as padded."""
    if not (cfg.train.packing and cfg.train.share_prompt) or not micro_batches:
        return micro_batches
    return packed_step(micro_batches, lambda p: pair_tokens(p, share_prompt=True), cfg)


def batch_to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The batch's tensors on `device`, its counts (COUNTS) left on the host."""
    return {k: v if k in COUNTS else v.to(device, non_blocking=True) for k, v in batch.items()}


def batch_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sequence response log-probs as the loss scores them (LD-DPO weighted under loss.ld_alpha), token
    counts, and the plain sums (for an NLL term); fp32, chosen sequences then rejected ([2B])."""
    scored = response_logps(model, batch, cfg.train.logps_chunk_size)
    return scored.weighted(ld_alpha_of(cfg.loss)), scored.counts, scored.sums
