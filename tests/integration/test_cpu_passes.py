"""cluster=cpu times each point's own passes (dpo_sweeps/cost/cpu_passes.py): its real architecture, with
its adapters, at its rows and length, on this CPU; cached per shape."""

from __future__ import annotations

import dataclasses

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.config.schema import Config
from dpo_sweeps.cost.cpu_passes import _model, cached_passes, measured_passes, micro_batch, pass_shape, timed_passes
from dpo_sweeps.parallel.plan import resolve_plan


def _shape(*overrides: str, model: str = "tiny_llama"):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = Config.of(OmegaConf.to_container(compose("config", overrides=[
            f"model={model}", "data.max_length=32", "data.max_prompt_length=16", *overrides]), resolve=True))
    return pass_shape(cfg, resolve_plan(cfg, 1), threads=1)


def test_a_points_passes_are_timed_on_its_model_and_cached():
    # bench_gpt2: blocks of milliseconds, so that a block (the difference of two timings) stands clear of
    # the noise of a machine the other test worker shares; tiny_llama's are a fraction of one.
    shape = _shape(model="bench_gpt2")
    assert cached_passes(shape) is None  # this session's cache starts empty
    timing = timed_passes(shape)
    passes = timing.passes
    assert cached_passes(shape) == passes  # read back, not timed again
    assert passes.block_train_s > passes.block_forward_s > 0
    # The rest (embeddings, LM head) is one timing less three blocks' worth: with the other worker's runs
    # on the cores it can come out at 0, and such a timing is provisional, taken again when quiet.
    assert passes.rest_train_s > 0 or timing.provisional, timing
    # Eight times the tokens a response: more time in every block.
    longer = measured_passes(dataclasses.replace(shape, response=8 * shape.response))
    assert longer.block_train_s > passes.block_train_s


def test_the_timed_batch_is_collated_as_a_run_collates_its_longest_pairs():
    shared, apart = _shape(), _shape("train.share_prompt=false")
    batch = micro_batch(shared, 100)
    # One row per pair: the prompt once, both responses; a 4-D mask keeps each response from the other's.
    assert batch["input_ids"].shape == (shared.pairs, shared.prompt + 2 * shared.response)
    assert batch["attention_mask"].dim() == 4
    batch = micro_batch(apart, 100)
    assert batch["input_ids"].shape == (2 * apart.pairs, apart.prompt + apart.response)
    assert (batch["attention_mask"] == 0).any()  # the last pair's shorter rejected response is padded


def test_the_timed_model_has_the_points_blocks_dtype_and_adapters():
    shape = _shape("peft=lora", "precision=bf16")
    model = _model(shape, 3)
    assert model.config.num_hidden_layers == 3
    params = list(model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    trained = sum(p.numel() for p in params if p.requires_grad)
    assert 0 < trained < sum(p.numel() for p in params) / 2  # LoRA's adapters only
    assert shape != _shape("precision=bf16")  # adapters are part of what decides the passes
    # Checkpointed as a run's trained model is (parallel/fsdp.py): backward's recompute is timed with it.
    assert _model(_shape("fsdp.activation_checkpointing=true"), 1).is_gradient_checkpointing
    assert not _model(_shape(), 1).is_gradient_checkpointing
