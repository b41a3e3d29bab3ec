"""The predicted step time of a training step on a cluster profile, from the config alone.

A step is `micro_batches` micro-batches, then the optimizer. Each micro-batch's time is its compute and the
part of its FSDP communication that compute does not hide:
- compute: model FLOPs (mfu.py's count, Chowdhery et al. 2022 app. B: 2 per weight and position forward,
  4 more backward, attention 4 x layers x hidden x length^2 forward) plus what the plan adds: the
  recompute of activation checkpointing (full: the blocks' forward again; selective: the attention core),
  the reference's forward when it is not cached. The dense FLOPs run at an achieved fraction of the
  device's dense peak that grows with the hidden size, e_dense(h) = e_max * h / (h + h_half); attention
  at its own fraction e_attn; every block also pays a fixed per-layer cost (kernel launches) per pass, and
  its norms, activations and residuals read and write the hidden states at the device's memory bandwidth
  (`elementwise_bytes` per hidden value). These five numbers are the calibration (CALIBRATIONS, fitted
  only on llm-foundry's MPT tables, per GPU generation: bench/fit_efficiency.py, bench/data/llm_foundry.csv).
  A measured CPU profile has no calibration and no rates: the point's own passes are timed at its shapes
  (cpu_passes.py), and `predict_measured` adds to them what the machine's profile measured FSDP, the
  optimizer and memory-bound copies to cost (cpu_profile.py).
- communication (FSDP2, Zhao et al. 2023, arXiv 2304.11277): per micro-batch an all-gather of the
  parameters in the compute dtype for forward, again for backward when resharded after forward, one for
  the reference's forward, and a reduce-scatter of the gradients in the reduce dtype; hybrid sharding adds
  an all-reduce of the gradient shard across replicas. A ring collective moves (n-1)/n of its bytes over the
  slowest link it crosses (NVLink/PCIe inside a node, the device's InfiniBand/RoCE share across nodes) and
  pays (n-1) link latencies per block. FSDP prefetches, so communication overlaps compute: only what exceeds
  the compute, and one block's gather and reduce-scatter (nothing to overlap them with), are exposed.
- adapters (peft): backward computes weight gradients for the adapters only (the frozen base passes input
  gradients through), only their gradients are reduce-scattered and only their shard is stepped; under
  qlora the 4-bit weights are gathered packed and unpacked at every pass through the blocks.
- optimizer: AdamW reads and writes the fp32 shard, its gradient and moments once (memory bound).

The interval: the calibration's 90th-percentile log error, widened by the share of the step spent in
communication (the least calibrated part) and for devices the calibration never saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpo_sweeps.cost.cpu_passes import MeasuredPasses
from dpo_sweeps.cost.profile import DeviceProfile

# Fitted by bench/fit_efficiency.py on bench/data/llm_foundry.csv only, one set per GPU generation the
# tables measured (its output, pasted). A profile of another device borrows the nearest generation's and
# gets a wider interval (UNCALIBRATED_WIDTH).
CALIBRATIONS = {
    "a100": {"e_max": 0.8, "h_half": 0, "e_attn": 0.5, "layer_overhead_s": 0.0002, "elementwise_bytes": 60,
             "log_error_q90": 0.15},
    "h100": {"e_max": 0.7, "h_half": 700, "e_attn": 0.3, "layer_overhead_s": 0.0002, "elementwise_bytes": 30,
             "log_error_q90": 0.238},
}
# Profile name -> (calibration, calibrated on this very device).
CALIBRATION_OF = {"a100_40gb": ("a100", True), "a100_80gb": ("a100", True), "h100_sxm": ("h100", True),
                  "h200_sxm": ("h100", False), "b200": ("h100", False), "l40s": ("a100", False)}
UNCALIBRATED_WIDTH = 0.15  # log units, added in quadrature: a device the tables never measured
MEASURED_WIDTH = 0.3  # a measured CPU profile: no calibration; FSDP, the optimizer and the loss from a synthetic model
# Adapters (peft): the calibration tables train every weight, so a frozen base's backward (input gradients
# only), the adapters' small matmuls and QLoRA's unpacking are counted from their FLOPs and bytes, never
# measured against published figures: log units, added in quadrature.
ADAPTER_WIDTH = 0.2
# A measured (CPU) profile times the model's passes and the scoring (cpu_passes.py); the DPO loss and the
# step's bookkeeping around them (the loss's log-sigmoid and margins, the metrics kept) are about this many
# small ops a micro-batch, at the profile's measured cost of one.
OPS_OUTSIDE_PASSES = 60
# Bytes AdamW's step moves per parameter of the shard: fp32 weight read+write, gradient read, two moments
# read+write.
OPTIMIZER_BYTES = 4 * 2 + 4 + 8 * 2


@dataclass(frozen=True)
class Workload:
    """What one rank computes in one step."""

    num_layers: int
    hidden: int
    block_params: int  # all blocks together
    head_params: int  # the LM head (hidden x vocab)
    positions: int  # positions the blocks run on, per micro-batch
    scored: int  # positions the LM head runs on, per micro-batch
    attention: int  # sum over rows of length^2, per micro-batch
    micro_batches: int  # per optimizer step (gradient accumulation)
    recompute: str = "none"  # activation checkpointing: none, selective, full
    reference_forward: bool = False  # a reference model's forward per micro-batch (not cached)
    trained_params: int | None = None  # parameters the optimizer steps (default: all); set: adapters (peft)
    trained_tensors: int = 0  # the tensors they are in (a measured profile's optimizer pays a cost per tensor)
    quantized_params: int = 0  # peft=qlora: base weights stored in 4-bit, dequantized at every pass
    quantized_bytes: int = 0  # their packed bytes with their quantization constants

    @property
    def params(self) -> int:
        return self.block_params + self.head_params

    @property
    def trained(self) -> int:
        return self.params if self.trained_params is None else self.trained_params

    def forward_dense_flops(self) -> float:
        """One forward's matmul FLOPs: 2 per weight and position, the LM head on the scored positions only."""
        return 2 * self.block_params * self.positions + 2 * self.head_params * self.scored

    def weight_gradient_flops(self) -> float:
        """Backward's weight gradients, 2 per trained weight and position: all of them for a full fine-tune;
        with adapters only theirs (in the blocks), as the frozen base computes input gradients alone."""
        if self.trained_params is None:
            return self.forward_dense_flops()
        return 2 * self.trained_params * self.positions

    def gathered_bytes(self, param_bytes: int) -> float:
        """The parameters FSDP all-gathers for a pass: 4-bit weights travel packed."""
        return (self.params - self.quantized_params) * param_bytes + self.quantized_bytes

    def model_flops(self) -> float:
        """The step's model FLOPs (mfu.py's count): forward and backward, plus the reference's forward."""
        forward = self.forward_dense_flops() + 4 * self.num_layers * self.hidden * self.attention
        return (3 + (1 if self.reference_forward else 0)) * forward * self.micro_batches


@dataclass(frozen=True)
class Layout:
    """How the ranks hold the model (parallel/plan.py's ParallelPlan, in the numbers the cost needs)."""

    world_size: int
    ranks_per_node: int
    shard_size: int
    replicate_size: int
    reshard_after_forward: bool
    param_bytes: int  # the compute dtype's
    reduce_bytes: int
    compute: str  # fp32, bf16, fp16
    fully_sharded: bool = True  # wrapped by fully_shard (ParallelPlan.fully_sharded): one fp32 rank is not


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def scaled(self, factor: float) -> Estimate:
        lo, hi = sorted((self.low * factor, self.high * factor))
        return Estimate(self.value * factor, lo, hi)

    def inverse(self, numerator: float) -> Estimate:
        return Estimate(numerator / self.value, numerator / self.high, numerator / self.low)


@dataclass(frozen=True)
class Prediction:
    step_time_s: Estimate
    tokens_per_s_per_device: Estimate
    mfu: Estimate | None  # None on a measured CPU profile (no datasheet peak)
    compute_s: float
    exposed_comm_s: float
    comm_s: float
    optimizer_s: float
    peak_memory_gib: float | None = None
    device_hours: Estimate | None = None
    # The step at its worst, every row at data.max_length (predict.py); step_time_s is the expected one
    # where the data's lengths were read (`lengths_from` says which pairs), else the worst (`lengths_reason`).
    worst_step_time_s: Estimate | None = None
    worst_device_hours: Estimate | None = None
    lengths_from: str | None = None
    lengths_reason: str | None = None
    # The share of the expected micro-batches' positions that are padding (None: the data was not read).
    padding_fraction: float | None = None
    # train.compile: priced as the eager step (predict.py says why).
    compiled_as_eager: bool = False
    # A measured profile: a timing it rests on was taken on a busy machine (cost/load.py), or doubted by a run.
    provisional: bool = False
    timed_shapes: tuple = ()  # the pass timings it used (cpu_passes.PassShape), to mark for re-timing

    @property
    def expected(self) -> bool:
        return self.lengths_from is not None

    def text(self) -> str:
        """One line for people; every figure with its interval; the step expected from the data's lengths,
        with the worst case beside it."""
        def show(e: Estimate, fmt: str) -> str:
            return f"{format(e.value, fmt)} [{format(e.low, fmt)}-{format(e.high, fmt)}]"

        s = self.step_time_s
        worst = self.worst_step_time_s
        if self.expected and worst is not None:
            step = f"step {show(s, '.3g')} s expected (worst case {worst.value:.3g} s)"
        else:
            step = f"step {show(s, '.3g')} s at the worst case"
        parts = [step]
        if self.padding_fraction is not None:
            parts.append(f"padding {100 * self.padding_fraction:.0f}%")
        parts.append(f"{show(self.tokens_per_s_per_device, ',.0f')} tok/s/device")
        if self.mfu is not None:
            parts.append(f"MFU {show(self.mfu.scaled(100), '.1f')}%")
        if self.device_hours is not None:
            hours = f"{show(self.device_hours, '.3g')} device-h"
            if self.expected and self.worst_device_hours is not None:
                hours += f" (worst case {self.worst_device_hours.value:.3g})"
            parts.append(hours)
        if self.peak_memory_gib is not None:
            parts.append(f"peak {self.peak_memory_gib:.2f} GiB")
        if self.compiled_as_eager:
            parts.append("train.compile priced as eager")
        if self.provisional:
            parts.append("PROVISIONAL: a timing taken on a busy machine, re-taken at the next quiet chance")
        return ", ".join(parts)


def dense_efficiency(hidden: int, calibration: dict) -> float:
    return calibration["e_max"] * hidden / (hidden + calibration["h_half"])


def _collective_time(nbytes: float, group: int, crosses_nodes: bool, profile: DeviceProfile,
                     collectives: int) -> float:
    """A ring all-gather or reduce-scatter of `nbytes` (the whole buffer) over `group` ranks, split in
    `collectives` calls (one per block)."""
    if group <= 1:
        return 0.0
    bandwidth, latency = ((profile.inter_bandwidth, profile.inter_latency) if crosses_nodes
                          else (profile.intra_bandwidth, profile.intra_latency))
    return nbytes * (group - 1) / group / bandwidth + collectives * (group - 1) * latency


def calibration_of(profile_name: str) -> tuple[dict, bool]:
    """The calibration a profile is predicted with, and whether the tables measured that device."""
    name, calibrated = CALIBRATION_OF.get(profile_name, ("h100", False))
    return CALIBRATIONS[name], calibrated


def predict_step(work: Workload, layout: Layout, profile: DeviceProfile, calibration: dict | None = None,
                 passes: MeasuredPasses | None = None) -> Prediction:
    """The step on `profile`: from its calibration on a datasheet profile; on a measured one (cluster=cpu)
    from the point's timed `passes` (predict_measured)."""
    if profile.measured:
        if passes is None:
            raise ValueError("a measured profile (cluster=cpu) predicts from the point's timed passes (cpu_passes.py)")
        return predict_measured(work, layout, profile, passes)
    default, calibrated = calibration_of(profile.name)
    calibration = calibration or default
    peak = profile.peak(layout.compute)
    attention_forward = 4 * work.num_layers * work.hidden * work.attention
    passes = 3 + (1 if work.reference_forward else 0)
    # Forward, backward's input gradients (as many FLOPs again), the reference's forward; then backward's
    # weight gradients, of the trained weights only (a full fine-tune: one forward's worth).
    dense = (passes - 1) * work.forward_dense_flops() + work.weight_gradient_flops()
    attention = passes * attention_forward
    layer_passes = passes
    if work.recompute == "full":  # the blocks' forward again in backward (not the head)
        dense += 2 * work.block_params * work.positions
        attention += attention_forward
        layer_passes += 1
    elif work.recompute == "selective":  # the attention core again
        attention += attention_forward
    dense_rate = peak * dense_efficiency(work.hidden, calibration)
    attention_rate = peak * calibration["e_attn"]
    layer_cost = calibration["layer_overhead_s"]
    # Norms, activations, residuals and dropout read and write the hidden states: memory bound, so a device
    # with more FLOP/s per byte of bandwidth (an H100 against an A100) spends a larger share of its step there.
    elementwise = (calibration["elementwise_bytes"] * layer_passes * work.num_layers * work.positions * work.hidden
                   * layout.param_bytes / profile.memory_bandwidth)
    compute = dense / dense_rate + attention / attention_rate + layer_passes * work.num_layers * layer_cost \
        + elementwise + _dequantize_s(work, layout, profile, layer_passes)

    # FSDP communication per micro-batch.
    s, r = layout.shard_size, layout.replicate_size
    shard_crosses = s > layout.ranks_per_node
    replicas_cross = layout.world_size > layout.ranks_per_node and not shard_crosses
    gathers = 1 + (1 if layout.reshard_after_forward else 0) + (1 if work.reference_forward else 0)
    blocks = work.num_layers + 1
    gather = _collective_time(work.gathered_bytes(layout.param_bytes), s, shard_crosses, profile, blocks)
    # Only trained parameters have gradients to reduce (adapters: theirs alone).
    reduce = _collective_time(work.trained * layout.reduce_bytes, s, shard_crosses, profile, blocks)
    replicate = 2 * _collective_time(work.trained / s * layout.reduce_bytes, r, replicas_cross, profile, blocks)
    comm = gathers * gather + reduce + replicate
    one_block = (gather + reduce + replicate) / blocks
    exposed = max(0.0, comm - compute) + one_block
    micro = compute + exposed

    optimizer = OPTIMIZER_BYTES * work.trained / s / profile.memory_bandwidth
    step = work.micro_batches * micro + optimizer

    comm_share = work.micro_batches * exposed / step
    width = math.hypot(calibration["log_error_q90"], 0.6 * comm_share, 0.0 if calibrated else UNCALIBRATED_WIDTH,
                       ADAPTER_WIDTH if work.trained_params is not None else 0.0)
    step_e = Estimate(step, step * math.exp(-width), step * math.exp(width))
    tokens = work.positions * work.micro_batches
    return Prediction(step_e, step_e.inverse(tokens), step_e.inverse(work.model_flops() / peak),
                      work.micro_batches * compute, work.micro_batches * exposed, work.micro_batches * comm, optimizer)


def predict_measured(work: Workload, layout: Layout, profile: DeviceProfile, passes: MeasuredPasses) -> Prediction:
    """The step on a measured profile (cluster=cpu): the point's timed passes (cpu_passes.py), and what the
    profile measured FSDP's units, their bytes, the optimizer and QLoRA's unpacking to add (cpu_profile.py).
    Nothing overlaps: gloo's collectives and FSDP's copies take the cores the compute would use."""
    layers = work.num_layers
    compute = layers * passes.block_train_s + passes.rest_train_s
    layer_passes = 3
    if work.reference_forward:
        compute += layers * passes.block_forward_s + passes.rest_forward_s
        layer_passes += 1
    if work.recompute != "none":  # timed within the passes (cpu_passes.py checkpoints as a run does)
        layer_passes += 1
    compute += OPS_OUTSIDE_PASSES * profile.op_overhead_s + _dequantize_s(work, layout, profile, layer_passes)

    # FSDP: each unit's fixed cost for this wrapping (hooks, copies, the collectives' calls), then its bytes.
    s, r = layout.shard_size, layout.replicate_size
    wrapping = _wrapping(layout)
    units = work.num_layers + 1
    unit_pass, unit_step = profile.fsdp_unit_cost(wrapping) if wrapping else (0.0, 0.0)
    if s > 1 and r > 1:  # hybrid: the replicas' all-reduce too, as no_shard's
        unit_pass, unit_step = (a + b for a, b in zip((unit_pass, unit_step), profile.fsdp_unit_cost("no_shard")))
    gathers = (1 + (1 if layout.reshard_after_forward else 0) + (1 if work.reference_forward else 0)) if s > 1 else 0
    gathered = work.gathered_bytes(layout.param_bytes)
    comm = units * unit_pass + gathers * _collective_time(gathered, s, False, profile, 0) \
        + _collective_time(work.trained * layout.reduce_bytes, s, False, profile, 0) \
        + 2 * _collective_time(work.trained / s * layout.reduce_bytes, r, False, profile, 0)
    if wrapping:  # FSDP copies each gathered parameter in and out (casting it), and each gradient out
        comm += (max(gathers, 1) * 2 * gathered / s + 2 * work.trained * layout.reduce_bytes / s) \
            / profile.memory_bandwidth
    optimizer = profile.optimizer_s_per_param * work.trained / s + profile.optimizer_s_per_tensor * work.trained_tensors \
        + units * unit_step
    step = work.micro_batches * (compute + comm) + optimizer

    comm_share = work.micro_batches * comm / step
    width = math.hypot(MEASURED_WIDTH, 0.6 * comm_share)
    step_e = Estimate(step, step * math.exp(-width), step * math.exp(width))
    tokens = work.positions * work.micro_batches
    return Prediction(step_e, step_e.inverse(tokens), None, work.micro_batches * compute,
                      work.micro_batches * comm, work.micro_batches * comm, optimizer)


def _wrapping(layout: Layout) -> str | None:
    """How FSDP wraps a run's model, as the measured profile names it (cpu_profile.py); None: not at all.
    One rank is wrapped only to cast or offload (Layout.fully_sharded), as the profile's `cast` measures."""
    if not layout.fully_sharded:
        return None
    if layout.world_size == 1:
        return "cast"
    if layout.shard_size == 1:
        return "no_shard"
    return "full_shard" if layout.reshard_after_forward else "shard_grad_op"


def _dequantize_s(work: Workload, layout: Layout, profile: DeviceProfile, layer_passes: int) -> float:
    """QLoRA: every pass through the blocks but backward's weight gradients (forward, input gradients,
    recompute, reference) unpacks the 4-bit weights into the compute dtype, reading the packed bytes and
    writing the unpacked ones (memory bound)."""
    return (layer_passes - 1) * (work.quantized_bytes + work.quantized_params * layout.param_bytes) \
        / profile.memory_bandwidth
