"""The reference of an adapter run (peft): the policy itself with its adapters switched off
(models/adapters.py `reference_mode`), scored as a reference model is (response_logps.py)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from dpo_sweeps.dpo.response_logps import METHOD, enable_chunked_logps
from dpo_sweeps.models.adapters import REFERENCE_ADAPTER, has_reference_adapter, reference_mode


class AdapterReference:
    """The reference of an adapter run: the policy itself in `reference_mode`, under no grad.

    It is called as the reference model is (response_logps.py: the model's call, or its response-positions
    scoring method, which goes through the policy's FSDP root); its parameters are the reference's own
    (the base's, and the reference adapter's), under the base model's names: the cache key of precomputed
    log-probs names them.
    """

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy
        self.config = policy.config

    def __call__(self, *args, **kwargs):
        with torch.no_grad(), reference_mode(self.policy):
            return self.policy(*args, **kwargs)

    def __getattr__(self, name: str):
        if name != METHOD:
            raise AttributeError(name)
        enable_chunked_logps(self.policy)
        method = getattr(self.policy, METHOD)

        def scored(*args, **kwargs):
            with torch.no_grad(), reference_mode(self.policy):
                return method(*args, **kwargs)
        return scored

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        keep = f".{REFERENCE_ADAPTER}." if has_reference_adapter(self.policy) else None
        for name, param in self.policy.named_parameters():
            if (".lora_" in name or ".modules_to_save." in name) and (keep is None or keep not in name):
                continue
            yield name.replace(".base_layer.", ".").replace(".original_module.", "."), param
