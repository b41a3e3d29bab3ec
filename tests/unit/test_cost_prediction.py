"""What a sweep will cost (dpo_sweeps/cost/): the cluster profiles and their sources, and the step-time
prediction on a config worked out by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.config.schema import ClusterConfig, Config
from dpo_sweeps.cost.cpu_passes import MeasuredPasses
from dpo_sweeps.cost.predict import device_profile, layout_of, predict_config
from dpo_sweeps.cost.profile import CLUSTER_DIR, DeviceProfile, builtin_cluster
from dpo_sweeps.cost.step_time import (
    ADAPTER_WIDTH,
    MEASURED_WIDTH,
    OPS_OUTSIDE_PASSES,
    Layout,
    Workload,
    predict_step,
)
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.parallel.fit import model_shape_of
from dpo_sweeps.parallel.memory_estimate import ModelShape
from dpo_sweeps.parallel.plan import resolve_plan

GPU_PROFILES = ("a100_40gb", "a100_80gb", "h100_sxm", "h200_sxm", "b200", "l40s")


def test_every_gpu_profile_passes_its_schema_and_cites_a_source_for_each_figure():
    assert {p.stem for p in CLUSTER_DIR.glob("*.yaml")} >= {*GPU_PROFILES, "cpu"}
    for name in GPU_PROFILES:
        cluster = builtin_cluster(name)  # checked: every number there and in range
        assert cluster.name == name and not cluster.measured
        cited = set(cluster.sources)
        assert {"peak_tflops", "device_memory_gib", "memory_bandwidth_gb_s", "intra_node_gb_s",
                "inter_node_gb_s", "latency"} <= cited, name
        assert set(cluster.peak_tflops) == {"fp32", "tf32", "bf16", "fp16"}
        # Dense peaks: bf16 tensor cores beat plain fp32 on every one of these devices.
        assert cluster.peak_tflops["bf16"] > cluster.peak_tflops["fp32"]
    assert builtin_cluster("cpu").measured  # its numbers come from the micro-benchmark


def _custom(**changes) -> ClusterConfig:
    values = {k: v for k, v in vars(builtin_cluster("h100_sxm")).items() if not k.startswith("_")}
    values.update(changes)
    return ClusterConfig.of(values)


@pytest.mark.parametrize(("changes", "refusal"), [
    ({"inter_node_gb_s": -5.0}, "cluster.inter_node_gb_s: got -5 (accepted: a number > 0)"),
    ({"memory_bandwidth_gb_s": None}, "cluster.memory_bandwidth_gb_s: missing"),
    ({"intra_node_latency_us": -1.0}, "cluster.intra_node_latency_us: got -1.0"),
    ({"peak_tflops": {"fp32": 67, "bf16": 989, "fp8": 1979}}, "cluster.peak_tflops.fp8: unknown precision"),
    ({"peak_tflops": {"fp32": 67}}, "cluster.peak_tflops.bf16: missing"),
    ({"gpus_per_node": 0}, "cluster.gpus_per_node: got 0"),
    ({"sources": {}}, "cluster.sources: empty"),
])
def test_a_custom_profile_with_a_missing_or_impossible_field_is_refused_naming_it(changes, refusal):
    with pytest.raises(InvalidConfig) as error:
        device_profile(_custom(**changes))
    assert refusal in str(error.value)
    assert "\n" not in str(error.value)


# The hand-worked device: 100 TFLOP/s bf16, 1 TB/s memory, 100 GB/s links without latency; dense matmuls at
# half the peak, attention at a quarter, no per-layer or elementwise cost; the interval's base 0.1 (log).
# FSDP over 4 ranks of one node, bf16 compute, fp32 reduce.
HAND_PROFILE = DeviceProfile(name="h100_sxm", gpus_per_node=8, memory_gib=80, memory_bandwidth=1e12,
                             peak_flops={"fp32": 1e13, "bf16": 1e14}, intra_bandwidth=1e11, intra_latency=0.0,
                             inter_bandwidth=1e10, inter_latency=0.0)
HAND_CALIBRATION = {"e_max": 0.5, "h_half": 0, "e_attn": 0.25, "layer_overhead_s": 0.0, "elementwise_bytes": 0,
                    "log_error_q90": 0.1}
HAND_LAYOUT = Layout(world_size=4, ranks_per_node=4, shard_size=4, replicate_size=1, reshard_after_forward=True,
                     param_bytes=2, reduce_bytes=4, compute="bf16")


def test_a_prediction_worked_out_by_hand():
    work = Workload(num_layers=2, hidden=1000, block_params=20_000_000, head_params=10_000_000, positions=1000,
                    scored=500, attention=1_000_000, micro_batches=2)
    p = predict_step(work, HAND_LAYOUT, HAND_PROFILE, HAND_CALIBRATION)
    # Per micro-batch, dense: 3 x (2 x 2e7 x 1000 + 2 x 1e7 x 500) = 1.5e11 FLOPs at 5e13/s = 3.0e-3 s;
    # attention: 3 x 4 x 2 layers x 1000 x 1e6 = 2.4e10 at 2.5e13/s = 9.6e-4 s. Compute 3.96e-3 s.
    assert p.compute_s == pytest.approx(2 * 3.96e-3)
    # FSDP over 4 ranks in a node: each all-gather moves 3e7 x 2 B x 3/4 = 4.5e7 B at 1e11 B/s = 4.5e-4 s
    # (forward and again backward), the reduce-scatter 3e7 x 4 B x 3/4 = 9e-4 s: 1.8e-3 s < compute, so
    # only one block's share is exposed, (4.5e-4 + 9e-4) / 3 units (2 blocks + root) = 4.5e-4 s.
    assert p.comm_s == pytest.approx(2 * 1.8e-3)
    assert p.exposed_comm_s == pytest.approx(2 * 4.5e-4)
    # AdamW: 28 B per parameter of the 3e7 / 4 shard at 1e12 B/s = 2.1e-4 s.
    assert p.optimizer_s == pytest.approx(2.1e-4)
    # Step: 2 x (3.96e-3 + 4.5e-4) + 2.1e-4 = 9.03e-3 s; 2000 tokens a step: 221,484 tokens/s per device.
    assert p.step_time_s.value == pytest.approx(9.03e-3)
    assert p.tokens_per_s_per_device.value == pytest.approx(2000 / 9.03e-3)
    # Model FLOPs 3 x (4e10 + 1e10 + 8e9) x 2 = 3.48e11 over 9.03e-3 s x 1e14: MFU 38.5%.
    assert p.mfu.value == pytest.approx(3.48e11 / (9.03e-3 * 1e14))
    # Interval: exposed communication is 9e-4 / 9.03e-3 = 9.97% of the step; width = hypot(0.1, 0.6 x 0.0997).
    width = math.hypot(0.1, 0.6 * 9e-4 / 9.03e-3)
    assert p.step_time_s.low == pytest.approx(9.03e-3 * math.exp(-width))
    assert p.step_time_s.high == pytest.approx(9.03e-3 * math.exp(width))
    assert p.tokens_per_s_per_device.low == pytest.approx(2000 / p.step_time_s.high)


def _config(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return Config.of(OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True))


SHAPE = ModelShape(num_params=125_000_000, num_layers=12, hidden=768, intermediate=3072, vocab=50257)


def test_a_dpo_config_pays_for_its_reference_pass_and_its_recompute_and_never_comes_without_an_interval():
    base = ("cluster=a100_80gb", "precision=bf16", "resources.nproc_per_node=8", "train.batch_size=64",
            "data.max_length=512")
    cached = predict_config(_config(*base), device_profile(builtin_cluster("a100_80gb")), shape=SHAPE)
    live = predict_config(_config(*base, "train.precompute_reference_logps=false"),
                          device_profile(builtin_cluster("a100_80gb")), shape=SHAPE)
    recompute = predict_config(_config(*base, "fsdp.activation_checkpointing=true"),
                               device_profile(builtin_cluster("a100_80gb")), shape=SHAPE)
    assert live.compute_s > cached.compute_s * 1.25  # a fourth pass, and its gathers
    assert recompute.compute_s > cached.compute_s
    for p in (cached, live, recompute):
        assert p.step_time_s.low < p.step_time_s.value < p.step_time_s.high
        assert p.device_hours.low < p.device_hours.value < p.device_hours.high
        assert "[" in p.text() and "device-h" in p.text()
    # 120 steps (conf/config.yaml) on 8 devices.
    assert cached.device_hours.value == pytest.approx(cached.step_time_s.value * 120 * 8 / 3600)


def _published(name: str) -> tuple[float, float]:
    """(median absolute error, share inside the interval) of bench/predict_vs_published.py on a CSV."""
    import csv
    import statistics
    import sys

    sys.path.insert(0, str(REPO / "bench"))
    from predict_vs_published import predicted

    with open(REPO / "bench" / "data" / name, newline="") as f:
        rows = list(csv.DictReader(f))
    errors, inside = [], 0
    for row in rows:
        e, measured = predicted(row), float(row["tokens_per_s_per_gpu"])
        errors.append(abs(e.value - measured) / measured)
        inside += e.low <= measured <= e.high
    return statistics.median(errors), inside / len(rows)


def test_the_predictor_meets_its_targets_on_the_published_tables_it_was_and_was_not_fitted_on():
    fitted_error, _ = _published("llm_foundry.csv")
    assert fitted_error <= 0.15
    held_out_error, held_out_inside = _published("held_out.csv")
    assert held_out_error <= 0.20 and held_out_inside >= 0.7


def test_adapters_worked_out_by_hand():
    """The by-hand config above with LoRA adapters of 1e6 parameters in its blocks, then with its 2e7 block
    weights in 4-bit: weight gradients, reduce-scatter and optimizer for the adapters alone."""
    lora = Workload(num_layers=2, hidden=1000, block_params=21_000_000, head_params=10_000_000, positions=1000,
                    scored=500, attention=1_000_000, micro_batches=2, trained_params=1_000_000)
    p = predict_step(lora, HAND_LAYOUT, HAND_PROFILE, HAND_CALIBRATION)
    # Dense: forward 2 x 2.1e7 x 1000 + 2 x 1e7 x 500 = 5.2e10, twice (forward, input gradients), plus the
    # adapters' weight gradients 2 x 1e6 x 1000 = 2e9: 1.06e11 at 5e13/s = 2.12e-3 s; attention as before
    # 9.6e-4 s. Compute 3.08e-3 s per micro-batch.
    assert p.compute_s == pytest.approx(2 * 3.08e-3)
    # Gathers move all 3.1e7 parameters (6.2e7 B x 3/4 = 4.65e-4 s, twice), the reduce-scatter the adapters'
    # 4e6 B x 3/4 = 3e-5 s: 9.6e-4 s in all, one unit's share exposed: (4.65e-4 + 3e-5) / 3 = 1.65e-4 s.
    assert p.comm_s == pytest.approx(2 * 9.6e-4)
    assert p.exposed_comm_s == pytest.approx(2 * 1.65e-4)
    # AdamW over the adapters' shard: 28 B x 1e6 / 4 at 1e12 B/s = 7e-6 s.
    assert p.optimizer_s == pytest.approx(7e-6)
    assert p.step_time_s.value == pytest.approx(2 * (3.08e-3 + 1.65e-4) + 7e-6)
    width = math.hypot(0.1, 0.6 * 2 * 1.65e-4 / p.step_time_s.value, ADAPTER_WIDTH)  # adapters: wider
    assert p.step_time_s.high == pytest.approx(p.step_time_s.value * math.exp(width))

    # QLoRA: the 2e7 base block weights in 4-bit, 1e7 packed bytes with 0.05e7 of constants. Each of the two
    # passes through the blocks (forward, backward) unpacks them: (1.05e7 + 2e7 x 2 B) / 1e12 B/s = 5.05e-5 s.
    qlora = dataclasses.replace(lora, quantized_params=20_000_000, quantized_bytes=10_500_000)
    q = predict_step(qlora, HAND_LAYOUT, HAND_PROFILE, HAND_CALIBRATION)
    assert q.compute_s == pytest.approx(2 * (3.08e-3 + 2 * 5.05e-5))
    # The gathers move the packed weights: (1.1e7 x 2 B + 1.05e7 B) x 3/4 = 2.4375e-4 s each.
    assert q.comm_s == pytest.approx(2 * (2 * 2.4375e-4 + 3e-5))


def test_a_lora_config_is_predicted_with_its_adapters():
    full = _config("model=tiny_llama", "cluster=h100_sxm", "resources.nproc_per_node=2")
    lora = _config("model=tiny_llama", "cluster=h100_sxm", "resources.nproc_per_node=2", "peft=lora")
    p_full = predict_config(full, device_profile(full.cluster))
    p_lora = predict_config(lora, device_profile(lora.cluster))
    trained = model_shape_of(lora).trainable_params
    assert 0 < trained < model_shape_of(full).num_params / 2
    # Only the adapters are stepped: AdamW's time scales with the parameters it steps.
    assert p_lora.optimizer_s / p_full.optimizer_s == pytest.approx(trained / model_shape_of(full).num_params)
    assert p_lora.comm_s < p_full.comm_s  # only their gradients are reduced
    assert p_lora.step_time_s.high / p_lora.step_time_s.value > p_full.step_time_s.high / p_full.step_time_s.value


# A measured (cluster=cpu) profile worked out by hand: a copy at 10 GB/s, gloo at 1 GB/s, 10 us an op, AdamW
# 1 ns a parameter and 20 us a tensor; what one FSDP unit adds to a micro-batch and to the optimizer step, per wrapping; and the
# passes a point's model was timed at.
HAND_CPU = DeviceProfile(name="cpu", gpus_per_node=2, memory_gib=None, memory_bandwidth=1e10,
                         peak_flops={"fp32": 1e11, "bf16": 1e11, "fp16": 1e11}, intra_bandwidth=1e9,
                         intra_latency=1e-4, inter_bandwidth=1e9, inter_latency=1e-4, measured=True,
                         op_overhead_s=1e-5, optimizer_s_per_param=1e-9, optimizer_s_per_tensor=2e-5,
                         fsdp_unit_s=(("cast", 1e-4, 2e-4), ("full_shard", 1e-3, 5e-4), ("no_shard", 4e-4, 3e-4),
                                      ("shard_grad_op", 6e-4, 5e-4)))
HAND_PASSES = MeasuredPasses(block_train_s=0.01, block_forward_s=0.003, rest_train_s=0.007, rest_forward_s=0.003)
HAND_CPU_WORK = Workload(num_layers=2, hidden=100, block_params=1_000_000, head_params=1_000_000, positions=1000,
                         scored=500, attention=100_000, micro_batches=2, trained_tensors=30)


def test_a_measured_profile_predicts_from_the_points_timed_passes_worked_out_by_hand():
    one_rank = Layout(world_size=1, ranks_per_node=1, shard_size=1, replicate_size=1, reshard_after_forward=True,
                      param_bytes=4, reduce_bytes=4, compute="fp32", fully_sharded=False)
    p = predict_step(HAND_CPU_WORK, one_rank, HAND_CPU, passes=HAND_PASSES)
    # Two blocks' training passes, the rest of the pass (embeddings, head), the loss's ops: 0.0276 s a micro-batch.
    compute = 2 * 0.01 + 0.007 + OPS_OUTSIDE_PASSES * 1e-5
    assert p.compute_s == pytest.approx(2 * compute)
    assert p.comm_s == 0  # one rank in fp32: not wrapped by FSDP at all
    # AdamW over 2e6 parameters in 30 tensors: its loops over tensors cost as much again as the parameters.
    assert p.optimizer_s == pytest.approx(1e-9 * 2_000_000 + 30 * 2e-5)
    assert p.step_time_s.value == pytest.approx(2 * compute + 2.6e-3)
    assert p.step_time_s.high == pytest.approx(p.step_time_s.value * math.exp(MEASURED_WIDTH))
    assert p.mfu is None  # no datasheet peak

    # Two ranks, full_shard, a live reference: its forward through the blocks and the rest; 3 units a
    # millisecond each; 3 gathers of 8e6 B (half of them over gloo: 4e-3 s each) and the reduce-scatter's
    # (4e-3 s); FSDP's copies in and out of each rank's half (3 x 2 x 4e6 + 2 x 4e6 B at 10 GB/s).
    two = Layout(world_size=2, ranks_per_node=2, shard_size=2, replicate_size=1, reshard_after_forward=True,
                 param_bytes=4, reduce_bytes=4, compute="fp32")
    live = dataclasses.replace(HAND_CPU_WORK, reference_forward=True)
    q = predict_step(live, two, HAND_CPU, passes=HAND_PASSES)
    compute_live = compute + 2 * 0.003 + 0.003
    comm = 3 * 1e-3 + 3 * 4e-3 + 4e-3 + (3 * 2 * 4e6 + 2 * 4e6) / 1e10
    assert q.compute_s == pytest.approx(2 * compute_live)
    assert q.comm_s == pytest.approx(2 * comm)
    # AdamW over the rank's half (every tensor has a half on each rank), and each unit's share of the step on
    # sharded tensors.
    assert q.optimizer_s == pytest.approx(1e-9 * 1_000_000 + 30 * 2e-5 + 3 * 5e-4)
    assert q.step_time_s.value == pytest.approx(2 * (compute_live + comm) + q.optimizer_s)
    width = math.hypot(MEASURED_WIDTH, 0.6 * 2 * comm / q.step_time_s.value)
    assert q.step_time_s.low == pytest.approx(q.step_time_s.value * math.exp(-width))

    # One rank in bf16 is wrapped to cast: the cast's unit cost and copies, no collective.
    cast = dataclasses.replace(one_rank, param_bytes=2, compute="bf16", fully_sharded=True)
    c = predict_step(HAND_CPU_WORK, cast, HAND_CPU, passes=HAND_PASSES)
    assert c.comm_s == pytest.approx(2 * (3 * 1e-4 + (2 * 4e6 + 2 * 8e6) / 1e10))


def test_a_measured_profile_without_the_points_passes_is_refused():
    one_rank = Layout(world_size=1, ranks_per_node=1, shard_size=1, replicate_size=1, reshard_after_forward=True,
                      param_bytes=4, reduce_bytes=4, compute="fp32")
    with pytest.raises(ValueError, match="timed passes"):
        predict_step(HAND_CPU_WORK, one_rank, HAND_CPU)


def test_a_layout_is_wrapped_by_fully_shard_as_the_run_would_be():
    """One rank is wrapped only to cast or offload (ParallelPlan.fully_sharded, the estimate's and the
    cost's one answer); two ranks always."""
    def wrapped(*overrides: str) -> bool:
        cfg = _config("model=tiny_llama", "cluster=cpu", *overrides)
        return layout_of(resolve_plan(cfg), cfg.resources.nproc_per_node).fully_sharded

    assert not wrapped("precision=fp32")
    assert wrapped("precision=bf16")
    assert wrapped("precision=fp32", "precision.reduce_dtype=bfloat16")  # casts its gradients
    assert wrapped("precision=fp32", "fsdp.cpu_offload=true")
    assert wrapped("precision=fp32", "resources.nproc_per_node=2")
