"""peft=lora on real multi-rank FSDP2 (gloo, CPU processes): it trains under every strategy and precision,
the reference is the base with the adapters off (step-1 loss ln 2, unchanged by training), checkpoints
hold the adapters only and resume exactly, and model/ is a PEFT adapter folder of the trained policy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import REPO, run_cli

# 3 optimizer steps of 8 pairs over 2 ranks, 2 per micro-batch (2 accumulation steps).
LEAN = ["model=tiny_llama", "peft=lora", "peft.r=4", "train.max_steps=3", "train.eval_every=0", "train.batch_size=8",
        "train.micro_batch_size=2", "train.warmup_steps=0", "train.lr=1e-2", "data.num_train_pairs=64",
        "data.num_eval_pairs=16", "perf.warmup_steps=1", "train.save_model=true"]
LN2 = math.log(2)


def check_lora_run(result, world_size: int = 2) -> None:
    """Completed; step 1 at ln 2 (the policy starts as its reference); every adapter trained."""
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = result.summary["metrics"]
    assert result.summary["plan"]["adapters"] == "LoRA r=4" and result.summary["plan"]["label"].endswith(" LoRA r=4")
    assert metrics["world_size"] == world_size and metrics["steps"] == 3
    losses = result.train_losses()
    assert abs(losses[0] - LN2) < 1e-6, losses
    assert losses[1:] != [losses[0]] * 2, losses
    # LoRA's B starts at zero: a B still zero is an adapter that never got a gradient (issue 36's traps).
    weights = load_file(result.run_dir / "model" / "adapter_model.safetensors")
    b_weights = {k: v for k, v in weights.items() if "lora_B" in k}
    assert len(b_weights) == 2 * 7  # 2 blocks x q, k, v, o, gate, up, down
    assert all(v.abs().max() > 0 for v in b_weights.values()), [k for k, v in b_weights.items() if not v.any()]


# A representative matrix: each strategy and each precision at least once, the per-step reference too.
MATRIX = [
    ("full_shard", "fp32", True),
    ("shard_grad_op", "bf16", True),  # reshard_after_forward=false: the precompute pass runs the policy first
    ("no_shard", "fp16", True),
    pytest.param("full_shard", "bf16", False, marks=pytest.mark.slow),
    pytest.param("shard_grad_op", "fp32", False, marks=pytest.mark.slow),
    pytest.param("no_shard", "bf16", True, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("strategy", "precision", "precompute"), MATRIX)
def test_lora_trains_on_two_ranks_from_ln2(tmp_path, strategy, precision, precompute):
    result = run_cli(tmp_path / "run", *LEAN, f"fsdp={strategy}", f"precision={precision}",
                     "resources.nproc_per_node=2", f"train.precompute_reference_logps={precompute}")
    check_lora_run(result)


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])
def test_lora_hybrid_shard_on_four_ranks(tmp_path, precision):
    result = run_cli(tmp_path / "run", *LEAN, "fsdp=hybrid_shard", "fsdp.hybrid_group_size=2",
                     f"precision={precision}", "resources.nproc_per_node=4", timeout=600)
    check_lora_run(result, world_size=4)


@pytest.mark.slow
def test_the_reference_is_unchanged_by_training(tmp_path):
    """The per-step reference (the base with adapters off, scored at every step) equals the one scored
    once before training: every step's loss and rewards agree, so training moved only the adapters."""
    before = run_cli(tmp_path / "precomputed", *LEAN, "fsdp=shard_grad_op", "resources.nproc_per_node=2",
                     "train.precompute_reference_logps=true", "train.max_steps=4")
    during = run_cli(tmp_path / "per_step", *LEAN, "fsdp=shard_grad_op", "resources.nproc_per_node=2",
                     "train.precompute_reference_logps=false", "train.max_steps=4")
    assert before.returncode == 0 and during.returncode == 0, before.stderr[-2000:] + during.stderr[-2000:]
    keys = ("train/loss", "train/rewards/chosen", "train/rewards/rejected", "eval/loss", "eval/rewards/margins")
    rows = lambda r: [{k: v for k, v in rec.items() if k in keys} for rec in r.records]  # noqa: E731
    for a, b in zip(rows(before), rows(during), strict=True):
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (key, a, b)


def _trained_policy_logps(run_dir: Path, overrides: list[str]) -> tuple[float, float, float]:
    """eval/logps/chosen as the saved adapter (on a base rebuilt from the same seed) and the merged model
    score the run's held-out pairs, and as the run logged it for its trained policy."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from dpo_sweeps import api
    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.data.collate import collate
    from dpo_sweeps.dpo.response_logps import response_logps
    from dpo_sweeps.models.build import build_policy
    from dpo_sweeps.parallel.rank_env import RankEnv
    from dpo_sweeps.train.setup import build_data

    cfg = Config.of(_plain(api.compose(overrides)))
    data = build_data(cfg, REPO, RankEnv(0, 1, 0, 1, "127.0.0.1", 0))
    base = build_policy(cfg.model, data.tokenizer, cfg.train.seed)
    adapter = PeftModel.from_pretrained(base, run_dir / "model").eval()
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "model_merged").eval()

    def mean_chosen(model) -> float:
        total = 0.0
        with torch.no_grad():
            for pair in data.eval_pairs:
                batch = collate([pair], data.tokenizer.pad_token_id)
                total += float(response_logps(model, batch, 0).sums[0])
        return total / len(data.eval_pairs)

    logged = [r for r in (run_dir / "metrics.jsonl").read_text().splitlines() if '"eval/loss"' in r][-1]
    return mean_chosen(adapter), mean_chosen(merged), json.loads(logged)["eval/logps/chosen"]


def _plain(composed) -> dict:
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(composed, resolve=False)
    values.pop("hydra", None)
    return OmegaConf.to_container(OmegaConf.create(values), resolve=True)


def test_model_folder_is_a_peft_adapter_of_the_trained_policy(tmp_path):
    overrides = [*LEAN, "fsdp=full_shard", "train.save_merged=true"]
    result = run_cli(tmp_path / "run", *overrides, "resources.nproc_per_node=2")
    check_lora_run(result)
    adapter, merged, logged = _trained_policy_logps(tmp_path / "run", overrides)
    assert adapter == pytest.approx(logged, rel=1e-5) and merged == pytest.approx(logged, rel=1e-5)


@pytest.mark.slow
def test_a_crashed_lora_run_resumes_from_an_adapter_only_checkpoint_exactly(tmp_path):
    """fp32, 2 ranks: a crash at step 5 (checkpoint at 4), then the same command: every logged value
    equals an uninterrupted run's; the checkpoints hold the adapters and their optimizer state only."""
    import torch.distributed.checkpoint as dcp

    from dpo_sweeps.rundir.checkpoints import complete_checkpoints

    overrides = [*LEAN, "resources.nproc_per_node=2", "train.max_steps=6", "train.eval_every=3",
                 "train.warmup_steps=2", "train.lr_schedule=linear", "checkpoint.every_steps=2",
                 "checkpoint.keep_when_completed=true", "train.save_model=false"]
    baseline = run_cli(tmp_path / "uninterrupted", *overrides)
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    faulted = [*overrides, "faults.kind=crash", "faults.step=5", "faults.rank=1"]
    crashed = run_cli(tmp_path / "run", *faulted)
    assert crashed.returncode == 1 and [c.step for c in complete_checkpoints(tmp_path / "run")] == [2, 4]
    resumed = run_cli(tmp_path / "run", *faulted)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.summary["resumed_from_step"] == 4
    without_perf = lambda r: [{k: v for k, v in rec.items() if not k.startswith("perf/")} for rec in r.records]  # noqa: E731
    assert without_perf(resumed) == without_perf(baseline) and len(resumed.train_losses()) == 6

    saved = dcp.FileSystemReader(str(complete_checkpoints(tmp_path / "run")[-1].path)).read_metadata()
    model_keys = [k for k in saved.state_dict_metadata if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys), model_keys
    assert any(k.startswith("optimizer.state.") and ".lora_A." in k for k in saved.state_dict_metadata)


@pytest.fixture(scope="module")
def sft_adapter(tmp_path_factory) -> Path:
    """A run directory whose model/ is a LoRA adapter trained with loss=sft (2 ranks)."""
    run_dir = tmp_path_factory.mktemp("sft") / "run"
    result = run_cli(run_dir, *LEAN, "loss=sft", "resources.nproc_per_node=2")
    assert result.returncode == 0, result.stderr[-2000:]
    return run_dir


def test_dpo_from_an_sft_adapter_trains_a_copy_against_the_adapter(tmp_path, sft_adapter):
    """The policy starts as the SFT adapter and the reference is that adapter (rewards 0 at step 1), not the
    bare base, whose log-probs a fresh adapter starts from."""
    fresh = run_cli(tmp_path / "fresh", *LEAN, "resources.nproc_per_node=2", "train.precompute_reference_logps=false")
    started = run_cli(tmp_path / "dpo", *LEAN, "resources.nproc_per_node=2", f"model.init_from={sft_adapter}",
                      "train.precompute_reference_logps=false")
    check_lora_run(started)
    first, base_first = started.records[0], fresh.records[0]
    assert first["train/rewards/chosen"] == 0 and first["train/rewards/rejected"] == 0
    assert first["train/logps/chosen"] != pytest.approx(base_first["train/logps/chosen"], rel=1e-4)
    sft_weights = load_file(sft_adapter / "model" / "adapter_model.safetensors")
    trained = load_file(tmp_path / "dpo" / "model" / "adapter_model.safetensors")
    assert sft_weights.keys() == trained.keys() and any(not torch.equal(sft_weights[k], trained[k]) for k in trained)
