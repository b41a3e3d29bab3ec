"""Summed response log-probs of a collated batch under a causal LM: the number DPO's loss is made of.

Two ways, the same numbers up to float rounding (tests/integration/test_techniques.py):
- full logits (`train.logps_chunk_size=0`): the model's [N, L, V] logits; at the response positions,
  cast to fp32, log-softmax, gather — as the reference DPO implementation;
- response positions only (`train.logps_chunk_size=K`): the backbone's hidden states at the positions
  that predict a response token, through the LM head K rows at a time (`chunked_token_logps`). Prompt
  and padding positions never reach the LM head, and no [N, L, V] tensor exists. This is also the only
  way to score a prefix-shared batch (`train.share_prompt`) or a packed one (`train.packing`,
  data/packing.py), whose response positions are not a shift.

Either way the per-token values are kept beside the sums (`ResponseLogps`), for LD-DPO's weighting.
Under FSDP2 the second way runs as a registered forward method of the root module, so the root's
parameters (embeddings, final norm, LM head) are gathered around it as they are around `forward`.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import register_fsdp_forward_method

from dpo_sweeps.dpo.token_logps import (
    chunked_token_logps,
    labelled_token_logps,
    length_desensitized_sums,
    sum_by_sequence,
)
from dpo_sweeps.errors import InvalidConfig

METHOD = "dpo_response_token_logps"
# Config fields of architectures whose logits are not plain `lm_head(hidden)`.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "logits_scaling",
                    "lm_head_multiplier")


def _response_token_logps(self, input_ids, attention_mask, position_ids, token_rows, token_positions, token_targets,
                          chunk_size):
    if attention_mask.dim() == 4:
        attention_mask = _dense_mask_for(self, attention_mask)
    hidden = self.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=False).last_hidden_state
    head = self.get_output_embeddings()
    return chunked_token_logps(hidden[token_rows, token_positions], head.weight, head.bias, token_targets, chunk_size)


def attention_implementation(model: torch.nn.Module) -> str:
    return getattr(model.config, "_attn_implementation", None) or "sdpa"


def attention_path(model: torch.nn.Module, *, dense_mask: bool) -> str:
    """How the model's attention runs the batches (summary.json's perf/attention): its implementation and
    the mask it is given, a dense 4-D one (prefix-shared or packed rows) or the 2-D padding mask."""
    return f"{attention_implementation(model)}_{'dense_mask' if dense_mask else 'padding_mask'}"


def _dense_mask_for(model: torch.nn.Module, mask: torch.Tensor) -> torch.Tensor:
    """The boolean [R, 1, L, L] mask (prefix-shared or packed rows) in the form the model's attention takes:
    SDPA a boolean, eager additive."""
    impl = attention_implementation(model)
    if impl == "sdpa":
        return mask
    if impl == "eager":
        dtype = model.get_input_embeddings().weight.dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
    raise InvalidConfig("train.share_prompt", f"or train.packing true with attention implementation '{impl}' "
                        "(needs a 4-D mask)", "both false, or a model using sdpa or eager attention")


def check_chunked_logps_support(model: torch.nn.Module) -> None:
    """Refuse models whose logits are more than the LM head's output (the chunked path would be wrong)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in LOGIT_TRANSFORMS:
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise InvalidConfig("train.logps_chunk_size", f"{type(model).__name__} transforms its logits ({name})",
                                "0 (full logits) for this model")
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise InvalidConfig("train.logps_chunk_size", f"{type(model).__name__} has no LM head to score with",
                            "0 (full logits) for this model")


def enable_chunked_logps(model: torch.nn.Module) -> None:
    """Give `model` the response-positions scoring method (once; also under FSDP2)."""
    if hasattr(model, METHOD):
        return
    check_chunked_logps_support(model)
    setattr(model, METHOD, types.MethodType(_response_token_logps, model))
    register_fsdp_forward_method(model, METHOD)  # a no-op for a model FSDP does not wrap


@dataclass
class ResponseLogps:
    """Per-sequence response log-probs of a batch (fp32), chosen sequences then rejected ([2B])."""

    sums: torch.Tensor  # summed log-probs of each response's tokens
    counts: torch.Tensor  # response tokens per sequence
    token_logps: torch.Tensor  # [M] every scored token's log-prob
    token_sequences: torch.Tensor  # [M] the sequence each scored token counts for

    def weighted(self, ld_alpha: float | None) -> torch.Tensor:
        """The sums as the loss scores them: LD-DPO's (`loss.ld_alpha`: tokens past the shorter response of
        the pair weigh alpha) when set, else the plain sums."""
        if ld_alpha is None:
            return self.sums
        return length_desensitized_sums(self.token_logps, self.token_sequences, self.counts, ld_alpha)


def response_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor], chunk_size: int) -> ResponseLogps:
    """Score every response token of a collated batch under `model` (see the module docstring for the two ways)."""
    # The batch says how many pairs it holds: its rows do not (one per pair shared, packed any number).
    num_sequences = 2 * int(batch["num_pairs"])
    if chunk_size == 0:  # full logits; never a prefix-shared or packed batch (the schema refuses both with it)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        token_logps, sequences = labelled_token_logps(logits, batch["labels"])
    else:
        enable_chunked_logps(model)
        token_logps = getattr(model, METHOD)(
            batch["input_ids"], batch["attention_mask"], batch.get("position_ids"), batch["token_rows"],
            batch["token_positions"], batch["token_targets"], chunk_size,
        )
        sequences = batch["token_sequences"]
    sums, counts = sum_by_sequence(token_logps, sequences, num_sequences)
    return ResponseLogps(sums, counts, token_logps, sequences)


def batch_logps(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed response log-probs (fp32) and response token counts, one per sequence ([2B]: chosen, rejected)."""
    scored = response_logps(model, batch, chunk_size)
    return scored.sums, scored.counts
