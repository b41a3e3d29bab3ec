"""The paths that run only on GPUs, checked here on a CPU: where models land, how the reference is cast
and freed, how MFU is counted, what the memory estimate counts, CPU offload under auto, the fp16
loss scaler (tests/integration/test_gpu_launch.py: SLURM, rank devices, torchrun)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from dpo_sweeps.config.schema import Config
from dpo_sweeps.models.build import build_reference
from dpo_sweeps.parallel.fsdp import needs_fully_shard, shard_model
from dpo_sweeps.parallel.gpu_driver import gpu_driver_present
from dpo_sweeps.parallel.plan import resolve_plan
from dpo_sweeps.parallel.precision import mixed_precision_policy

PRECISIONS = {
    "fp32": {"param_dtype": "float32", "reduce_dtype": "float32"},
    "bf16": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "fp16": {"param_dtype": "float16", "reduce_dtype": "float32"},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(scope="module")
def one_rank_group():
    """A real one-rank gloo process group in this process (FSDP's meshes need one)."""
    if dist.is_initialized():
        pytest.fail("a process group is already initialized in the test process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,), mesh_dim_names=("shard",))
    dist.destroy_process_group()


def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def plan_of(precision: str = "fp32", cpu_offload: bool = False):
    """The one-rank full_shard plan of `precision` (plan.resolve_plan)."""
    fsdp = {"sharding_strategy": "full_shard", "reshard_after_forward": True, "hybrid_group_size": None,
            "activation_checkpointing": False, "cpu_offload": cpu_offload}
    return resolve_plan(Config.of({"fsdp": fsdp, "precision": {**PRECISIONS[precision], "loss_scaling": False},
                                   "resources": {"nodes": 1, "nproc_per_node": 1}}))


def roles(precision: str) -> dict[str, MixedPrecisionPolicy]:
    """The policy gets the precision's policy; the reference (stored in the compute dtype) an empty one."""
    return {"policy": mixed_precision_policy(plan_of(precision)),
            "reference": MixedPrecisionPolicy()}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("world_size", [1, 2, 8])
@pytest.mark.parametrize("cpu_offload", [False, True])
def test_which_models_fsdp_wraps_for_every_precision_and_rank_count(precision, world_size, cpu_offload):
    """Wrapped models are FSDP's to move (to the mesh's device); the others shard_model moves (below)."""
    for role, mp_policy in roles(precision).items():
        wrapped = needs_fully_shard(world_size, mp_policy, cpu_offload)
        # One rank with nothing to cast or offload runs unwrapped: the fp32 policy, and every reference
        # (stored in its compute dtype, it casts nothing).
        assert wrapped == (world_size > 1 or cpu_offload or (role == "policy" and precision != "fp32")), role


@pytest.mark.parametrize("precision", PRECISIONS)
def test_one_rank_models_that_fsdp_does_not_wrap_are_moved_to_the_device(one_rank_group, precision):
    """The `meta` device stands in for a GPU: whatever is not wrapped must end there, buffers included."""
    policy = tiny_llama()
    reference = build_reference(policy, DTYPES[precision])
    for role, mp_policy in roles(precision).items():
        model = policy if role == "policy" else reference
        if needs_fully_shard(1, mp_policy, cpu_offload=False):
            continue  # fully_shard moves it to the mesh's device (below)
        placed = shard_model(model, plan=plan_of(), block_name="LlamaDecoderLayer", mesh=one_rank_group,
                             mp_policy=mp_policy, device=torch.device("meta"), trainable=role == "policy")
        assert {t.device.type for t in [*placed.parameters(), *placed.buffers()]} == {"meta"}, role


def test_one_rank_models_fsdp_wraps_land_on_the_mesh_device(one_rank_group):
    policy = tiny_llama()
    placed = shard_model(policy, plan=plan_of(), block_name="LlamaDecoderLayer", mesh=one_rank_group,
                         mp_policy=roles("bf16")["policy"], device=torch.device("cpu"))
    assert all(hasattr(p, "to_local") and p.device.type == "cpu" for p in placed.parameters())
    with pytest.raises(ValueError, match="cannot place"):
        shard_model(tiny_llama(), plan=plan_of(), block_name="LlamaDecoderLayer", mesh=one_rank_group,
                    mp_policy=roles("bf16")["policy"], device=torch.device("meta"))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_reference_casts_parameters_only_keeping_rope_inv_freq_in_fp32(precision):
    policy = tiny_llama()
    reference = build_reference(policy, DTYPES[precision])
    assert {p.dtype for p in reference.parameters()} == {DTYPES[precision]}
    inv_freq = dict(reference.named_buffers())["model.rotary_emb.inv_freq"]
    assert inv_freq.dtype == torch.float32
    assert torch.equal(inv_freq, dict(policy.named_buffers())["model.rotary_emb.inv_freq"])
    assert not any(p.requires_grad for p in reference.parameters()) and not reference.training
    assert {p.dtype for p in policy.parameters()} == {torch.float32}


def compose_run_config(*overrides: str):
    from hydra import compose, initialize_config_dir
    from support import QUIET, REPO

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*QUIET, *overrides])
    return Config.of(OmegaConf.to_container(cfg, resolve=True))


def test_the_reference_is_released_once_its_log_probs_are_precomputed(one_rank_group, tmp_path, monkeypatch):
    """No model may outlive precompute as uncollected garbage (cycles through hooks and bound methods)."""
    import gc

    from transformers import PreTrainedModel

    from dpo_sweeps.parallel.rank_env import RankEnv
    from dpo_sweeps.runtime.context import RunContext
    from dpo_sweeps.train.trainer import Trainer

    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(tmp_path / "cache"))
    cfg = compose_run_config("model=tiny_llama", "precision=bf16", "train.max_steps=2", "data.num_train_pairs=32",
                             "data.num_eval_pairs=8", "train.batch_size=8", "train.micro_batch_size=4")
    ctx = RunContext(run_dir=tmp_path / "run", config=asdict(cfg), overrides=[], base_dir=tmp_path)
    env = RankEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="127.0.0.1", master_port=0)
    gc.collect()
    gc.disable()  # what the trainer frees must be freed by the trainer, not by a collection that happens to run
    try:
        trainer = Trainer(ctx, cfg, env, torch.device("cpu"))
        trainer.setup()
        assert trainer.built.reference is None and trainer.built.reference_precompute_s is not None
        policy_modules = {id(m) for m in trainer.built.policy.modules()}
        others = [o for o in gc.get_objects() if isinstance(o, PreTrainedModel) and id(o) not in policy_modules]
        assert others == [], [type(m).__name__ for m in others]
    finally:
        gc.enable()


# ---------------------------------------------------------------------- MFU: peaks and FLOPs
@pytest.mark.parametrize("name,precision,tf32,expected", [
    ("NVIDIA H100 80GB HBM3", "bf16", False, 989.4e12),  # SXM
    ("NVIDIA H100 PCIe", "bf16", False, 756.5e12),
    ("NVIDIA H100 NVL", "fp16", False, 835.5e12),
    ("NVIDIA H200", "bf16", False, 989.4e12),
    ("NVIDIA A100-SXM4-40GB", "bf16", False, 312e12),
    ("NVIDIA A100-SXM4-80GB", "fp16", False, 312e12),
    ("NVIDIA A100 80GB PCIe", "bf16", False, 312e12),
    ("NVIDIA L40S", "bf16", False, 362.05e12),
    # fp32 is plain fp32 unless TF32 matmuls are on (torch.set_float32_matmul_precision("high"))
    ("NVIDIA H100 80GB HBM3", "fp32", False, 66.9e12),
    ("NVIDIA H100 80GB HBM3", "fp32", True, 494.7e12),
    ("NVIDIA A100-SXM4-80GB", "fp32", False, 19.5e12),
    ("NVIDIA A100-SXM4-80GB", "fp32", True, 156e12),
])
def test_peak_flops_by_device_name_and_precision(name, precision, tf32, expected):
    from dpo_sweeps.parallel.mfu import peak_flops

    assert peak_flops(name, precision, tf32) == (expected, None)


@pytest.mark.parametrize("name", ["NVIDIA A10", "NVIDIA H800", "Tesla V100-SXM2-32GB", "NVIDIA GeForce RTX 4090"])
def test_devices_without_a_known_peak_get_no_mfu_but_a_reason(name):
    from dpo_sweeps.parallel.mfu import peak_flops

    peak, reason = peak_flops(name, "bf16", False)
    assert peak is None and name in reason


def test_a_cpu_run_has_no_mfu_and_says_why():
    from dpo_sweeps.parallel.mfu import device_peak_flops
    from dpo_sweeps.train.perf import PerfMeter

    peak, reason = device_peak_flops(torch.device("cpu"), "fp32")
    meter = PerfMeter(torch.device("cpu"), warmup_steps=0)
    meter.start()
    meter.stop(tokens=10, pairs=1, flops=1e9)
    perf = meter.summary(world_size=1, peak_flops=peak, mfu_reason=reason)
    assert perf["perf/mfu"] is None and perf["perf/mfu_reason"] == "MFU is measured on GPUs only"


def test_mfu_is_the_timed_steps_model_flops_over_the_peak():
    from dpo_sweeps.train.perf import PerfMeter

    meter = PerfMeter(torch.device("cpu"), warmup_steps=1)
    for flops in (5e9, 2e9, 4e9):  # the first step is warm-up, not timed
        meter.start()
        meter.stop(tokens=100, pairs=2, flops=flops)
    perf = meter.summary(world_size=1, peak_flops=1e12)
    wall = sum(meter.step_times[1:])
    assert perf["perf/mfu"] == pytest.approx(6e9 / wall / 1e12) and perf["perf/mfu_reason"] is None


def test_model_flops_of_one_batch_counted_by_hand_with_and_without_prompt_sharing():
    """Two pairs (prompt, chosen, rejected lengths 3, 2, 4 and 5, 1, 1) through tiny_llama's matmuls."""
    from dpo_sweeps.data.encoding import EncodedPair
    from dpo_sweeps.parallel.mfu import BatchPositions, ModelFlops

    flops = ModelFlops.of(tiny_llama(), "LlamaDecoderLayer")
    # Per block: q 32x32, k and v 32x16 (2 KV heads of 8), o 32x32, gate/up/down 32x64, two norms of 32.
    assert flops == ModelFlops(block_params=2 * 9280, head_params=64 * 32, num_layers=2, hidden=32)
    pairs = [EncodedPair([1] * 3, [2] * 2, [3] * 4), EncodedPair([1] * 5, [2], [3])]

    # Chosen and rejected rows (3+2, 5+1, 3+4, 5+1): the prompt runs twice; the head scores 2+4+1+1.
    rows = BatchPositions.of(pairs, share_prompt=False, full_logits=False)
    assert rows == BatchPositions(positions=24, scored=8, attention=25 + 36 + 49 + 36)
    # One row per pair (9, 7): the prompt runs once; the same 8 response positions are scored.
    shared = BatchPositions.of(pairs, share_prompt=True, full_logits=False)
    assert shared == BatchPositions(positions=16, scored=8, attention=81 + 49)
    # Full logits: the head runs on every position.
    assert BatchPositions.of(pairs, share_prompt=False, full_logits=True).scored == 24

    # Forward: 2 FLOPs per weight per position, attention 4 x layers x hidden x length^2 (PaLM, app. B).
    forward = 2 * 18560 * 16 + 2 * 2048 * 8 + 4 * 2 * 32 * 130
    assert flops.forward(shared) == forward == 659_968
    assert flops.step(shared, reference_forward=False) == 3 * forward  # forward and backward
    assert flops.step(shared, reference_forward=True) == 4 * forward  # plus the reference's forward
    assert flops.step(rows, reference_forward=False) == 3 * (2 * 18560 * 24 + 2 * 2048 * 8 + 4 * 2 * 32 * 146)


# ---------------------------------------------------------------------- the memory estimate
def test_memory_estimate_leaves_offloaded_states_out_and_counts_checkpointed_activations():
    import dataclasses

    from dpo_sweeps.parallel.memory_estimate import ModelShape, RunShape, estimate_peak_memory

    model = ModelShape(num_params=1_236_000_000, num_layers=16, hidden=2048, intermediate=8192, vocab=128256)
    run = RunShape(shard_group_size=1, param_dtype="bfloat16", optimizer="adamw",
                   micro_batch_size=2, seq_len=1024, logps_chunk_size=1024, share_prompt=True)
    base = estimate_peak_memory(model, run)
    offloaded = estimate_peak_memory(model, dataclasses.replace(run, cpu_offload=True))
    # Shards, gradients and AdamW state in CPU memory; the gathered bf16 copies stay on the GPU.
    assert base.model_states == 16 * model.num_params and offloaded.model_states == 0
    assert offloaded.gathered_params == base.gathered_params > 0
    assert offloaded.reference == 2 * 2 * model.block_params  # two gathered bf16 blocks, its shard offloaded
    assert offloaded.total == base.total - base.model_states - 2 * model.num_params

    checkpointed = estimate_peak_memory(model, dataclasses.replace(run, activation_checkpointing=True))
    tokens = 2 * 1024  # 2 shared-prompt rows of 1024
    saved_per_layer = tokens * (8 * 2048 + 5 * 8192) * 2  # one block's activations, in bf16
    block_inputs = tokens * 16 * 2048 * 2  # every block's input, kept for its recompute
    assert base.activations - checkpointed.activations == 15 * saved_per_layer - block_inputs
    assert checkpointed.activations < base.activations / 5


# ---------------------------------------------------------------------- CPU offload under device=auto
def test_cpu_offload_is_refused_before_launch_only_where_the_run_is_known_to_use_the_cpu(tmp_path):
    from dpo_sweeps.checks.validate import validate_config
    from dpo_sweeps.errors import InvalidConfig

    validate_config(compose_run_config("fsdp.cpu_offload=true", "resources.device=auto"), tmp_path)
    validate_config(compose_run_config("fsdp.cpu_offload=true", "resources.device=cuda"), tmp_path)
    with pytest.raises(InvalidConfig, match="^fsdp.cpu_offload: true on a CPU-only run"):
        validate_config(compose_run_config("fsdp.cpu_offload=true", "resources.device=cpu"), tmp_path)


# ---------------------------------------------------------------------- the fp16 loss scaler
def test_the_loss_scaler_reads_one_flag_from_the_device_for_all_gradients():
    """A host read (bool, item) is a GPU sync; the overflow check makes one, not one per parameter."""
    from torch.overrides import TorchFunctionMode

    from dpo_sweeps.parallel.precision import DynamicLossScaler

    class HostReads(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.count += getattr(func, "__name__", "") in ("__bool__", "item", "tolist", "__float__", "__int__")
            return func(*args, **(kwargs or {}))

    params = [torch.nn.Parameter(torch.ones(4)) for _ in range(20)]
    for p in params:
        p.grad = torch.full((4,), 8.0)
    scaler = DynamicLossScaler(enabled=True, initial_scale=4.0)
    with HostReads() as reads:
        assert scaler.unscale_and_check(params) is False
    assert reads.count == 1
    assert all(torch.equal(p.grad, torch.full((4,), 2.0)) for p in params)  # unscaled by 1/4

    params[13].grad[2] = float("inf")
    with HostReads() as reads:
        assert scaler.unscale_and_check(params) is True
    assert reads.count == 1
    assert torch.equal(params[0].grad, torch.full((4,), 2.0))  # a skipped step leaves the gradients alone


def test_wants_cuda_asks_torch_only_where_a_gpu_driver_is_loaded():
    """resources.device: cuda wants a GPU, cpu never; auto asks torch, but only where a driver is loaded
    (without one torch sees no GPU), so the process that supervises local ranks needs no torch."""
    code = ("import sys; from dpo_sweeps.parallel.gpu_driver import wants_cuda; "
            "print(wants_cuda('cuda'), wants_cuda('cpu'), wants_cuda('auto'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    cuda, cpu, auto, torch_loaded = out.stdout.split()
    assert (cuda, cpu, auto) == ("True", "False", str(torch.cuda.is_available())), out.stdout
    if not gpu_driver_present():
        assert torch_loaded == "False", out.stdout
