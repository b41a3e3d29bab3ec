"""How the step, the evaluation and the reference pass score pairs: a collated micro-batch, and its
response log-probs as the loss takes them."""

from __future__ import annotations

from typing import Any

import torch

from dpo_sweeps.config.schema import Config
from dpo_sweeps.data.collate import collate
from dpo_sweeps.data.encoding import EncodedPair
from dpo_sweeps.dpo.losses import ld_alpha_of
from dpo_sweeps.dpo.response_logps import response_logps


def collate_pairs(pairs: list[EncodedPair], tokenizer: Any, cfg: Config) -> dict[str, torch.Tensor]:
    return collate(pairs, tokenizer.pad_token_id, share_prompt=cfg.train.share_prompt)


def batch_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                cfg: Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sequence response log-probs as the loss scores them (LD-DPO weighted under loss.ld_alpha), token
    counts, and the plain sums (for an NLL term); fp32, chosen sequences then rejected ([2B])."""
    scored = response_logps(model, batch, cfg.train.logps_chunk_size)
    return scored.weighted(ld_alpha_of(cfg.loss)), scored.counts, scored.sums
