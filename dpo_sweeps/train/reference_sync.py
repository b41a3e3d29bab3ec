"""TR-DPO's reference sync (`train.reference_sync`): ref <- alpha * policy + (1 - alpha) * ref.

Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good Alignment" (TRL: `sync_ref_model`,
`ref_model_mixup_alpha`, `ref_model_sync_steps`). A full fine-tune's reference is a model of its own,
sharded exactly as the policy (the same blocks on the same mesh), so each rank mixes its own shards in
place, with no communication. With adapters the reference is a second, frozen adapter on the same layers
(models/adapters.py `REFERENCE_ADAPTER`), mixed from the policy's adapter the same way: the sync costs
adapter-sized memory, not a model.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dpo_sweeps.dpo.adapter_reference import AdapterReference
from dpo_sweeps.models.adapters import ADAPTER_NAME, REFERENCE_ADAPTER


def due(step: int, every_steps: int) -> bool:
    """Whether the reference syncs after optimizer step `step` (1-based)."""
    return every_steps > 0 and step % every_steps == 0


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a parameter (a DTensor under FSDP2), in place."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _pairs(policy: torch.nn.Module, reference) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(policy parameter, reference parameter) pairs, matched by name."""
    if isinstance(reference, AdapterReference):
        params = dict(policy.named_parameters())
        for name, param in params.items():
            if param.requires_grad and f".{ADAPTER_NAME}." in name:
                yield param, params[name.replace(f".{ADAPTER_NAME}.", f".{REFERENCE_ADAPTER}.")]
        return
    refs = dict(reference.named_parameters())
    for name, param in policy.named_parameters():
        yield param, refs[name]


@torch.no_grad()
def sync_reference(policy: torch.nn.Module, reference, alpha: float) -> None:
    """Move the reference toward the policy, each rank on its own shards (fp32 math, the reference's dtype)."""
    for source, target in _pairs(policy, reference):
        mine, theirs = _local(target), _local(source)
        mine.copy_(torch.lerp(mine.float(), theirs.float(), alpha))
