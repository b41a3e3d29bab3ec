"""peft=lora in one process: the adapters' settings are checked before launch, and the reference (the
policy with its adapters off) is the base model, before and after training, with its adapters still
trainable (peft's disable_adapter() would turn them off: issue 36)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dpo_sweeps import api
from dpo_sweeps.checks.unused import check_settings_used
from dpo_sweeps.checks.validate import validate_config
from dpo_sweeps.config.schema import Config
from dpo_sweeps.dpo.adapter_reference import AdapterReference
from dpo_sweeps.dpo.reference_logps import weights_digest
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.models.adapters import add_adapters, linear_names
from dpo_sweeps.models.tokenizers import byte_tokenizer


def plain(*overrides: str) -> dict:
    """The resolved config of these overrides, without Hydra's node (as a run's .hydra/config.yaml)."""
    values = OmegaConf.to_container(api.compose(overrides), resolve=False)
    values.pop("hydra", None)
    return OmegaConf.to_container(OmegaConf.create(values), resolve=True)


def config(*overrides: str) -> Config:
    return Config.of(plain(*overrides))


@pytest.mark.parametrize(("overrides", "message"), [
    (["peft=lora", "peft.r=0"], "peft.r: got 0 (accepted: an integer >= 1"),
    (["peft=lora", "peft.r=-2"], "peft.r: got -2"),
    (["peft=lora", "peft.alpha=0"], "peft.alpha: got 0"),
    (["peft=lora", "peft.dropout=1.5"], "peft.dropout: got 1.5"),
    (["peft=lora", "peft.target_modules=[]"], "peft.target_modules: an empty list"),
    (["peft=lora", "model=tiny_llama", "peft.target_modules=[q_proj,qkv]"],
     "peft.target_modules: LlamaForCausalLM has no module named 'qkv' (accepted: names of its linear layers: "
     "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"),
    (["peft=lora", "peft.target_modules=[q_proj]"],
     "peft.target_modules: GPT2LMHeadModel has no module named 'q_proj' (accepted: names of its linear layers: "
     "c_attn, c_fc, c_proj"),
    (["peft=lora", "model=tiny_llama", "peft.modules_to_save=[head]"], "peft.modules_to_save: LlamaForCausalLM has no"),
    (["peft=lora", "train.sample_prompts=2"], "train.sample_prompts: 2 with peft=lora"),
])
def test_bad_adapter_settings_are_refused_in_one_line_before_launch(overrides, message):
    with pytest.raises(InvalidConfig) as refused:
        validate_config(config(*overrides), Path("."))
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("key", ["peft.r=8", "peft.target_modules=[q_proj]", "train.save_merged=true"])
def test_adapter_keys_with_peft_none_are_refused(key):
    with pytest.raises(InvalidConfig, match=f"{key.split('=')[0]}: set, but not read here"):
        check_settings_used(config(key), [key])


def test_every_linear_layer_of_the_blocks_is_the_default_target():
    policy = config("model=tiny_gpt2", "peft=lora").model
    from dpo_sweeps.models.build import build_policy

    model = build_policy(policy, byte_tokenizer(), 0)
    assert linear_names(model, "GPT2Block") == ["c_attn", "c_fc", "c_proj"]


def _logps(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_the_reference_is_the_base_before_and_after_training(dropout):
    cfg = config("model=tiny_llama", "peft=lora", "peft.r=4", f"peft.dropout={dropout}")
    from dpo_sweeps.models.build import build_policy

    base = build_policy(cfg.model, byte_tokenizer(), 0).eval()
    policy = add_adapters(copy.deepcopy(base), cfg.peft, cfg.model.block_name).train()
    reference = AdapterReference(policy)
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = _logps(base, ids)
    trained = [p for p in policy.parameters() if p.requires_grad]
    assert trained and all(".lora_" in n for n, p in policy.named_parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    for _ in range(3):  # a reference pass first, as a step without precomputed log-probs runs it
        assert torch.equal(_logps(reference, ids), expected)
        assert all(p.requires_grad for p in trained) and policy.training
        _logps(policy, ids).sum().neg().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in policy.named_parameters()
                   if "lora_B" in n)  # (A's gradient is zero while B is: LoRA starts at B = 0)
        optimizer.step()
        optimizer.zero_grad()
    assert torch.equal(_logps(reference, ids), expected)
    with torch.no_grad():
        assert not torch.equal(_logps(policy.eval(), ids), expected)  # the adapters trained
    # The cache key of precomputed reference log-probs names the base weights, under the base's names.
    assert weights_digest(reference) == weights_digest(base)


def test_the_memory_estimate_counts_gradients_and_moments_of_the_adapters_only():
    from peft import PeftModel

    from dpo_sweeps.models.build import build_policy
    from dpo_sweeps.parallel.memory_estimate import ModelShape, RunShape, model_states, reference

    cfg = config("model=tiny_llama", "peft=lora", "peft.r=4")
    base = build_policy(cfg.model, byte_tokenizer(), 0)
    full = ModelShape.of(base)
    policy = add_adapters(copy.deepcopy(base), cfg.peft, cfg.model.block_name)
    shape = ModelShape.of(policy)
    trainable, total = PeftModel.get_nb_trainable_parameters(policy)
    assert full.trainable_params is None and (shape.trainable_params, shape.num_params) == (trainable, total)
    # The tensors AdamW steps (the forecast prices each): every one of a full fine-tune; under LoRA, the adapters' only.
    assert full.trained_tensors == len(list(base.parameters()))
    assert shape.trained_tensors == sum(p.requires_grad for p in policy.parameters()) > 0
    run = RunShape(shard_group_size=2, param_dtype="float32", optimizer="adamw", micro_batch_size=2, seq_len=64)
    assert model_states(shape, run) == (4 * total + 12 * trainable) // 2  # fp32 weights; grads + AdamW moments
    assert reference(full, run) > 0 and reference(shape, RunShape(**{**run.__dict__, "adapters": True})) == 0


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.reference_sync.every_steps=4"], "train.reference_sync.every_steps: 4 with "
                                              "train.precompute_reference_logps=true"),
    (["train.precompute_reference_logps=false", "train.reference_sync.every_steps=4",
      "train.reference_sync.alpha=0"], "train.reference_sync.alpha: got 0"),
    (["train.reference_sync.every_steps=-1"], "train.reference_sync.every_steps: got -1"),
])
def test_bad_reference_sync_settings_are_refused_in_one_line(overrides, message):
    with pytest.raises(InvalidConfig) as refused:
        validate_config(config(*overrides), Path("."))
    assert message in str(refused.value)


def test_reference_sync_with_a_loss_without_reference_is_refused():
    key = "train.reference_sync.every_steps=2"
    with pytest.raises(InvalidConfig, match="train.reference_sync.every_steps: set, but not read here"):
        check_settings_used(config("loss=simpo", key), [key])


@pytest.fixture(scope="module")
def adapter_run(tmp_path_factory) -> Path:
    """A run directory whose model/ is a LoRA adapter folder of tiny_llama, as a peft=lora run saves it."""
    from dpo_sweeps.models.adapters import save_adapter
    from dpo_sweeps.models.build import build_policy

    cfg = config("model=tiny_llama", "peft=lora", "peft.r=4")
    model = add_adapters(build_policy(cfg.model, byte_tokenizer(), 0), cfg.peft, cfg.model.block_name)
    run_dir = tmp_path_factory.mktemp("adapter")
    save_adapter(model, model.state_dict(), run_dir / "model", cfg.model.name_or_path)
    return run_dir


def test_an_adapter_to_start_from_is_checked_before_launch(tmp_path, adapter_run):
    validate_config(config("model=tiny_llama", "peft=lora", f"model.init_from={adapter_run}"), Path("."))
    cut = tmp_path / "cut"
    (cut / "model").mkdir(parents=True)
    for file in (adapter_run / "model").iterdir():
        (cut / "model" / file.name).write_bytes(file.read_bytes())
    weights = cut / "model" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    cases = [
        (["model=tiny_llama", "peft=lora", f"model.init_from={cut}"],
         f"model.init_from: the adapter in {cut / 'model'} is incomplete or unreadable"),
        (["model=tiny_gpt2", "peft=lora", f"model.init_from={adapter_run}"],
         "was trained on 'tiny-llama', this run's model is 'tiny-gpt2'"),
        (["model=tiny_llama", f"model.init_from={adapter_run}"], "holds a LoRA adapter, not a model, and peft=none"),
    ]
    for overrides, message in cases:
        with pytest.raises(InvalidConfig) as refused:
            validate_config(config(*overrides), Path("."))
        assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_tracking_reference_adapter_is_a_frozen_copy_left_out_of_the_saved_and_merged_model(tmp_path):
    """TR-DPO with adapters: a second adapter, frozen, starts equal to the policy's; model/ and model_merged/
    hold the policy's adapter only."""
    from peft import PeftModel

    from dpo_sweeps.models.adapters import merged_model, save_adapter
    from dpo_sweeps.models.build import build_policy

    cfg = config("model=tiny_llama", "peft=lora", "peft.r=4")
    base = build_policy(cfg.model, byte_tokenizer(), 0)
    policy = add_adapters(copy.deepcopy(base), cfg.peft, cfg.model.block_name, reference_copy=True)
    params = dict(policy.named_parameters())
    reference = {n: p for n, p in params.items() if ".reference." in n}
    assert reference and not any(p.requires_grad for p in reference.values())
    assert all(torch.equal(p, params[n.replace(".reference.", ".default.")]) for n, p in reference.items())
    with torch.no_grad():  # give the policy's adapter something to merge
        for name, param in params.items():
            if ".default." in name and "lora_B" in name:
                param.normal_(0, 0.1)
    ids = torch.randint(0, 200, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _logps(policy.eval(), ids)
        save_adapter(policy, policy.state_dict(), tmp_path / "model", cfg.model.name_or_path)
        loaded = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "model").eval()
        assert torch.allclose(_logps(loaded, ids), expected, atol=1e-5)
        assert torch.allclose(_logps(merged_model(policy, policy.state_dict()).eval(), ids), expected, atol=1e-5)


def test_reports_label_lora_runs_apart_from_full_fine_tunes(tmp_path):
    """summary.json's plan names the adapters, so the report's labels and heatmap rows keep LoRA runs apart."""
    import json

    from support.reports import write_run

    from dpo_sweeps.analysis.figures import heatmap_figure
    from dpo_sweeps.analysis.runs import read_run
    from dpo_sweeps.parallel.plan import resolve_plan

    for job, overrides in enumerate([["peft=lora", "peft.r=8"], ["peft=lora", "peft.r=8", "peft.use_dora=true"], []]):
        values = plain("resources.nproc_per_node=2", "precision=bf16", *overrides)
        run_dir = write_run(tmp_path / str(job), job, overrides, values, status="completed",
                            metrics={"perf/speed_per_memory": 1.0 + job, "eval/rewards/accuracies": 0.5})
        summary = json.loads((run_dir / "summary.json").read_text())
        plan = resolve_plan(Config.of(values)).as_dict()
        (run_dir / "summary.json").write_text(json.dumps({**summary, "plan": plan}))
    runs = [read_run(tmp_path / str(job), str(job), tmp_path) for job in range(3)]
    assert [r.plan["label"] for r in runs] == ["FULL_SHARD bf16 LoRA r=8", "FULL_SHARD bf16 DoRA r=8", "FULL_SHARD bf16"]
    assert [r.strategy_label for r in runs] == ["FULL_SHARD LoRA r=8", "FULL_SHARD DoRA r=8", "FULL_SHARD"]
    rows = [t.get_text() for t in heatmap_figure(runs).axes[0].get_yticklabels()]
    assert len(rows) == 3, rows
