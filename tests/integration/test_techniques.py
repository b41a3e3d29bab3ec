"""Speed and memory techniques change speed and memory, not the numbers DPO trains on.

Chunked response log-probs equal the full-logits computation (values and gradients), prefix-shared
batches score every response token in the context it has unshared, length-grouped sampling stays a
pure function of step, and precomputed reference log-probs give the same loss sequence as the
per-step reference pass.
"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from support import HH_PATH, REPO, run_cli

from dpo_sweeps.config.schema import ModelConfig
from dpo_sweeps.data.collate import collate
from dpo_sweeps.data.encoding import GlobalBatchSampler, encode_pairs, render_pair
from dpo_sweeps.data.sources import load_preference_rows
from dpo_sweeps.dpo.response_logps import batch_logps
from dpo_sweeps.dpo.token_logps import chunked_token_logps
from dpo_sweeps.models.build import build_policy
from dpo_sweeps.models.tokenizers import byte_tokenizer

SHORT = ["train.max_steps=6", "train.eval_every=0", "data.num_train_pairs=64", "data.num_eval_pairs=16",
         "train.batch_size=16", "train.micro_batch_size=4"]


def hh_pairs(n: int, tokenizer, max_length: int = 96, max_prompt_length: int = 48):
    cfg = OmegaConf.merge(OmegaConf.load(REPO / "conf" / "data" / "hh.yaml"), {"path": str(HH_PATH), "max_pairs": n})
    rows = load_preference_rows(cfg, REPO)
    pairs, _ = encode_pairs([render_pair(r) for r in rows.train], tokenizer, max_length=max_length,
                            max_prompt_length=max_prompt_length, truncation_mode="keep_end")
    return pairs


def tiny_model(preset: str, tokenizer):
    # The preset as a run composes it: its file over the schema's defaults.
    model_cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(REPO / "conf" / "model" / f"{preset}.yaml"))
    return build_policy(model_cfg, tokenizer, seed=0)


def test_chunked_token_logps_equal_log_softmax_of_full_logits_with_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(50, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (37,))
    upstream = torch.randn(37, dtype=torch.float64)

    full = torch.nn.functional.linear(hidden, weight, bias).log_softmax(-1).gather(1, targets[:, None]).squeeze(1)
    grads_full = torch.autograd.grad((full * upstream).sum(), (hidden, weight, bias))
    chunked = chunked_token_logps(hidden, weight, bias, targets, chunk_size=8)  # 5 chunks, the last one short
    grads_chunked = torch.autograd.grad((chunked * upstream).sum(), (hidden, weight, bias))

    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked.double(), full, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads_chunked, grads_full):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("preset", ["tiny_gpt2", "tiny_llama", "tiny_gpt_neox"])
def test_chunked_and_prefix_shared_sequence_logps_equal_the_full_logits_path(preset):
    tokenizer = byte_tokenizer()
    model = tiny_model(preset, tokenizer)
    pairs = hh_pairs(6, tokenizer)
    plain = collate(pairs, tokenizer.pad_token_id)
    shared = collate(pairs, tokenizer.pad_token_id, share_prompt=True)
    assert shared["input_ids"].shape[0] == len(pairs) and plain["input_ids"].shape[0] == 2 * len(pairs)
    assert int(shared["num_tokens"]) == int(plain["num_tokens"]) == int(plain["attention_mask"].sum())

    results = {}
    for name, batch, chunk in (("full", plain, 0), ("chunked", plain, 64), ("shared", shared, 64)):
        model.zero_grad()
        logps, counts = batch_logps(model, batch, chunk)
        logps.sum().backward()
        results[name] = (logps.detach(), counts, [p.grad.clone() for p in model.parameters()])

    full_logps, full_counts, full_grads = results["full"]
    assert (full_counts == torch.tensor([len(p.chosen) for p in pairs] + [len(p.rejected) for p in pairs])).all()
    for name in ("chunked", "shared"):
        logps, counts, grads = results[name]
        assert torch.equal(counts, full_counts), name
        torch.testing.assert_close(logps, full_logps, rtol=1e-5, atol=1e-4, msg=name)
        for g, g_full in zip(grads, full_grads):
            torch.testing.assert_close(g, g_full, rtol=1e-4, atol=1e-5, msg=name)


def test_length_grouped_sampler_is_a_pure_function_of_step_covers_each_epoch_and_cuts_padding():
    lengths = [(i * 37) % 101 + 5 for i in range(50)]  # 50 pairs: batches straddle epoch boundaries
    grouped = GlobalBatchSampler(50, 8, seed=3, lengths=lengths, group_window=4)
    # Fresh samplers, steps asked in any order: the same batches (what resuming relies on).
    assert [GlobalBatchSampler(50, 8, 3, lengths=lengths, group_window=4).indices(s) for s in (9, 2, 30)] == \
        [grouped.indices(s) for s in (9, 2, 30)]
    stream = [i for s in range(25) for i in grouped.indices(s)]  # 200 positions = 4 epochs
    for epoch in range(4):
        assert sorted(stream[epoch * 50 : (epoch + 1) * 50]) == list(range(50))
    assert GlobalBatchSampler(50, 8, 4, lengths=lengths, group_window=4).indices(0) != grouped.indices(0)

    def padding(sampler):
        return sum(max(lengths[i] for i in b) * 8 - sum(lengths[i] for i in b)
                   for b in (sampler.indices(s) for s in range(25)))

    assert padding(grouped) < 0.5 * padding(GlobalBatchSampler(50, 8, seed=3))


@pytest.mark.slow
def test_precomputed_reference_logps_give_the_same_losses_and_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(tmp_path / "cache"))
    per_step = run_cli(tmp_path / "per_step", *SHORT, "train.precompute_reference_logps=false")
    first = run_cli(tmp_path / "first", *SHORT, "train.precompute_reference_logps=true")
    again = run_cli(tmp_path / "again", *SHORT, "train.precompute_reference_logps=true", "loss.beta=0.1")
    for result in (per_step, first, again):
        assert result.returncode == 0, result.stderr[-2000:]
    losses = per_step.train_losses()
    assert losses[0] == pytest.approx(math.log(2), rel=1e-6)
    assert first.train_losses() == losses  # bit for bit: each pair scored in its own training micro-batch
    assert first.summary["metrics"]["eval/loss"] == per_step.summary["metrics"]["eval/loss"]
    log = first.stdout + first.stderr
    assert "reference log-probs: computed for 64 train and 16 eval pairs" in log
    assert "reference log-probs: cache" in again.stdout + again.stderr  # beta does not change the entry
    assert len(list((tmp_path / "cache" / "reference_logps").glob("*.pt"))) == 1
    assert again.train_losses()[0] == pytest.approx(math.log(2), rel=1e-6)


@pytest.mark.slow
def test_a_different_batch_layout_is_a_different_cache_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(tmp_path / "cache"))
    a = run_cli(tmp_path / "a", *SHORT)
    b = run_cli(tmp_path / "b", *SHORT, "train.micro_batch_size=8")
    assert a.returncode == 0 and b.returncode == 0, (a.stderr + b.stderr)[-2000:]
    assert "reference log-probs: computed" in b.stdout + b.stderr
    assert len(list((tmp_path / "cache" / "reference_logps").glob("*.pt"))) == 2


@pytest.mark.slow
def test_prefix_sharing_and_full_logits_runs_start_at_ln2(tmp_path):
    shared = run_cli(tmp_path / "shared", *SHORT, "train.share_prompt=true", "train.max_steps=2")
    full = run_cli(tmp_path / "full", *SHORT, "train.logps_chunk_size=0", "data.length_grouped=false",
                   "train.precompute_reference_logps=false", "train.share_prompt=false", "train.max_steps=2")
    for result in (shared, full):
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.train_losses()[0] == pytest.approx(math.log(2), rel=1e-6)
    # The same pairs in the same order: the two scoring paths agree to float rounding.
    shared_nograd = run_cli(tmp_path / "s2", *SHORT, "train.share_prompt=true", "data.length_grouped=false",
                            "train.max_steps=2")
    assert shared_nograd.returncode == 0, shared_nograd.stderr[-2000:]
    assert shared_nograd.train_losses() == pytest.approx(full.train_losses(), rel=1e-4)


def test_share_prompt_needs_chunked_logps(tmp_path):
    result = run_cli(tmp_path / "run", *SHORT, "train.share_prompt=true", "train.logps_chunk_size=0")
    assert result.returncode != 0
    assert "train.share_prompt" in result.stderr and "logps_chunk_size" in result.stderr
    assert result.summary["failure"]["kind"] == "invalid_config"
