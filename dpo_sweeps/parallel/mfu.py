"""Model FLOPs utilisation: the FLOPs a step's math needs, over what the GPU could do in that time.

Model FLOPs (Chowdhery et al. 2022, PaLM, arXiv 2204.02311, appendix B): a matmul weight costs 2 FLOPs
per position it is applied to in forward and 4 more in backward, attention 12 x layers x hidden x the
row's length per position (forward and backward); recomputation (activation checkpointing) and
padding are not counted. A DPO step applies the blocks to every position the model runs (a prompt
shared by chosen and rejected once, `train.share_prompt`), but the LM head only to the positions it
scores (the response positions, `train.logps_chunk_size` > 0; every position with full logits); a
reference scored in the step adds its forward pass. The input embedding is a lookup: no FLOPs. Packed
rows (`train.packing`) need the same FLOPs: each segment attends only to itself, so a row's attention
is the sum over its segments, the padded rows' count; what a dense mask computes beyond that is not
model FLOPs, like padding.

The peak is the GPU's dense (no sparsity) tensor-core peak for the plan's compute dtype (plan.py: what
the run computes in, whatever the precision preset is called) from NVIDIA's data sheets; fp32 is compared with the plain fp32 peak unless TF32 matmuls are enabled
(`torch.set_float32_matmul_precision("high")`), since that is what the GPU then runs. A device not in
the table gets no MFU, and the summary says why (`perf/mfu_reason`), rather than a wrong number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from dpo_sweeps.data.encoding import EncodedPair
from dpo_sweeps.models.build import check_block_name

_SXM = {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}
_NVL = {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60.0e12}
# Dense peak FLOP/s by device name (torch.cuda.get_device_name), the first match wins.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"\bH100\b.*\bNVL\b", _NVL),
    (r"\bH100\b.*\bPCIe\b", {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378.0e12, "fp32": 51.2e12}),
    (r"\bH100\b", _SXM),  # "NVIDIA H100 80GB HBM3", the SXM5 board
    (r"\bH200\b.*\bNVL\b", _NVL),
    (r"\b(GH200|H200)\b", _SXM),
    (r"\bA100\b", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}),  # 40 and 80 GB, SXM and PCIe
    (r"\bL40S\b", {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183.0e12, "fp32": 91.6e12}),
)


def peak_flops(device_name: str, compute: str, tf32: bool) -> tuple[float | None, str | None]:
    """(dense peak FLOP/s, None), or (None, why there is no peak) for an unknown device or compute dtype
    (`compute`: a short name of plan.DTYPES, the plan's `compute`)."""
    dtype = "tf32" if compute == "fp32" and tf32 else compute
    for pattern, peaks in PEAK_FLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            if dtype not in peaks:
                return None, f"no {dtype} peak for {device_name}"
            return peaks[dtype], None
    return None, f"no peak FLOP/s known for '{device_name}' (dpo_sweeps/parallel/mfu.py PEAK_FLOPS)"


def device_peak_flops(device: torch.device, compute: str) -> tuple[float | None, str | None]:
    """The run's device peak for the plan's compute dtype (`ParallelPlan.compute`: fp32, bf16, fp16);
    CPUs have none."""
    if device.type != "cuda":
        return None, "MFU is measured on GPUs only"
    tf32 = torch.get_float32_matmul_precision() != "highest"
    return peak_flops(torch.cuda.get_device_name(device), compute, tf32)


@dataclass(frozen=True)
class BatchPositions:
    """What one micro-batch of pairs makes the model compute (padding excluded)."""

    positions: int  # positions the blocks run on
    scored: int  # positions the LM head runs on
    attention: int  # sum over rows of the row's length squared

    @classmethod
    def of(cls, pairs: list[EncodedPair], *, share_prompt: bool, full_logits: bool) -> BatchPositions:
        if share_prompt:  # one row per pair: prompt + chosen + rejected
            rows = [len(p.prompt) + len(p.chosen) + len(p.rejected) for p in pairs]
        else:  # a chosen row and a rejected row, each with the prompt
            rows = [len(p.prompt) + len(p.chosen) for p in pairs] + [len(p.prompt) + len(p.rejected) for p in pairs]
        positions = sum(rows)
        scored = positions if full_logits else sum(len(p.chosen) + len(p.rejected) for p in pairs)
        return cls(positions, scored, sum(n * n for n in rows))


@dataclass(frozen=True)
class ModelFlops:
    """The matmul sizes a causal LM's FLOPs are counted from."""

    block_params: int  # all transformer blocks together
    head_params: int  # the LM head, hidden x vocab (tied with the input embedding or not)
    num_layers: int
    hidden: int

    @classmethod
    def of(cls, model: torch.nn.Module, block_name: str) -> ModelFlops:
        """From an unsharded Hugging Face causal LM."""
        blocks = check_block_name(model, block_name)
        head = model.get_output_embeddings().weight
        return cls(sum(p.numel() for b in blocks for p in b.parameters()), head.numel(), len(blocks),
                   model.config.hidden_size)

    def forward(self, batch: BatchPositions) -> float:
        return (2 * self.block_params * batch.positions + 2 * self.head_params * batch.scored
                + 4 * self.num_layers * self.hidden * batch.attention)

    def step(self, batch: BatchPositions, *, reference_forward: bool) -> float:
        """Policy forward and backward (3 x forward), plus the reference's forward when it runs in the step."""
        return (3 + (1 if reference_forward else 0)) * self.forward(batch)
