"""A packed run (train.packing) is priced as packed (dpo_sweeps/cost/): its micro-batches are the rows
data/packing.py's collate_packed builds, the passes of cluster=cpu are timed on those rows (their own cache
entries), and the forecast says how much of what it prices is padding."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.config.schema import Config
from dpo_sweeps.cost.cpu_passes import CACHE_VERSION, PassShape, micro_batch, pass_shape
from dpo_sweeps.cost.data_lengths import DataLengths, micro_batch_of, packed_row_tokens, simulated_steps
from dpo_sweeps.cost.predict import device_profile, predict_config
from dpo_sweeps.cost.profile import builtin_cluster
from dpo_sweeps.data.encoding import EncodedPair
from dpo_sweeps.data.packing import collate_packed
from dpo_sweeps.parallel.plan import resolve_plan
from dpo_sweeps.train.scoring import row_tokens

# (prompt, chosen, rejected) tokens: HH-like, a few long pairs among many short ones.
RAGGED = [(40, 8, 30), (12, 100, 6), (60, 60, 60), (5, 3, 9), (20, 14, 2), (33, 7, 70), (8, 8, 8), (90, 20, 25)]


def _config(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return Config.of(OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True))


def _pairs(lengths) -> list[EncodedPair]:
    return [EncodedPair([1] * p, [2] * c, [3] * r) for p, c, r in lengths]


@pytest.mark.parametrize("share_prompt", [True, False])
@pytest.mark.parametrize("budget", [256, 400])
def test_a_packed_micro_batch_is_the_rows_collate_packed_builds(share_prompt, budget):
    priced = micro_batch_of(RAGGED, share_prompt, budget)
    built = collate_packed(_pairs(RAGGED), pad_id=0, row_tokens=budget, share_prompt=share_prompt)
    assert (priced.rows, priced.width) == tuple(built["input_ids"].shape)
    assert built["attention_mask"].shape == (priced.rows, 1, priced.width, priced.width)  # the dense mask
    assert priced.tokens == int(built["num_row_tokens"])
    assert priced.response_tokens == len(built["token_targets"])
    padded = micro_batch_of(RAGGED, share_prompt)
    assert priced.positions < padded.positions and priced.padding < padded.padding


@pytest.mark.parametrize("overrides", [(), ("train.micro_batch_tokens=700",), ("train.share_prompt=false",)])
def test_the_forecast_budget_is_the_one_the_run_packs_with(overrides):
    cfg = _config("train.packing=true", "data.max_length=256", "data.max_prompt_length=128", *overrides)
    assert packed_row_tokens(RAGGED, cfg) == row_tokens(_pairs(RAGGED), cfg)
    assert packed_row_tokens(RAGGED, _config()) is None  # padded


@pytest.mark.parametrize("share_prompt", [True, False])
def test_the_forecasts_steps_are_the_micro_batches_the_run_packs(share_prompt):
    """Each simulated rank-step is what the trainer builds: its micro-batches regrouped over the step
    (train/scoring.py training_micro_batches, with a shared prompt), each packed by collate_pairs."""
    from types import SimpleNamespace

    from dpo_sweeps.data.encoding import GlobalBatchSampler, rank_micro_batch_indices
    from dpo_sweeps.train.scoring import collate_pairs, training_micro_batches

    cfg = _config("train.packing=true", "data.max_length=256", "data.max_prompt_length=128", "train.batch_size=16",
                  "train.micro_batch_size=4", "data.length_grouped=false", f"train.share_prompt={share_prompt}")
    pairs = RAGGED * 4
    steps = simulated_steps(pairs, cfg, 2)
    lengths = [p + c + r if share_prompt else p + max(c, r) for p, c, r in pairs]
    sampler = GlobalBatchSampler(len(pairs), 16, cfg.train.seed, lengths=lengths, group_window=0)
    tokenizer = SimpleNamespace(pad_token_id=0)
    step_packed, each_packed = 0, 0
    for s, step in enumerate(steps):
        for rank in range(2):
            indices = rank_micro_batch_indices(sampler.indices(s), rank, 2, 4)
            built = [collate_pairs(mb, tokenizer, cfg)
                     for mb in training_micro_batches([_pairs([pairs[i] for i in mb]) for mb in indices], cfg)]
            priced = [ranks[rank] for ranks in step]
            assert [(mb.rows, mb.width, mb.tokens) for mb in priced] == \
                   [(*b["input_ids"].shape, int(b["num_row_tokens"])) for b in built]
            step_packed += sum(mb.positions for mb in priced)
            budget = packed_row_tokens(pairs, cfg)
            each_packed += sum(micro_batch_of([pairs[i] for i in mb], share_prompt, budget).positions
                               for mb in indices)
    # With a shared prompt the step is packed as a whole: fewer positions than its micro-batches one by one.
    assert step_packed < each_packed if share_prompt else step_packed == each_packed


def _prediction(*overrides: str, pairs=RAGGED * 8):
    cfg = _config("cluster=h100_sxm", "data.max_length=256", "data.max_prompt_length=128", "train.batch_size=16",
                  "train.micro_batch_size=8", "data.length_grouped=false", *overrides)
    lengths = DataLengths(list(pairs), len(pairs), simulated_steps(list(pairs), cfg, 1))
    return predict_config(cfg, device_profile(cfg.cluster), 1, lengths=lengths), lengths


def test_ragged_pairs_are_expected_faster_packed_than_padded_with_less_padding():
    padded, padded_lengths = _prediction()
    packed, packed_lengths = _prediction("train.packing=true")
    assert packed.step_time_s.value < padded.step_time_s.value
    assert 0 <= packed.padding_fraction < padded.padding_fraction
    assert packed.padding_fraction == pytest.approx(packed_lengths.padding_fraction())
    # The default budget: the widest prefix-shared row at the data limits, 128 + 2 x 128 tokens.
    assert all(mb.row_tokens == 384 for mb in packed_lengths.micro_batches())
    assert "padding" in packed.text() and "expected (worst case" in packed.text()
    # The worst case, every pair at its longest, takes a row each at the default budget: the padded one.
    assert packed.worst_step_time_s.value == pytest.approx(padded.worst_step_time_s.value)


def test_pairs_of_one_length_a_row_each_are_priced_as_padded():
    longest = [(128, 128, 128)] * 32  # the row budget (data.max_length) holds one of them
    padded, _ = _prediction("train.share_prompt=false", pairs=longest)
    packed, _ = _prediction("train.share_prompt=false", "train.packing=true", pairs=longest)
    assert packed.step_time_s.value == pytest.approx(padded.step_time_s.value)
    assert packed.padding_fraction == padded.padding_fraction == 0


def test_a_wider_budget_packs_the_worst_case_into_fewer_wider_rows_under_a_dense_mask():
    default, _ = _prediction("train.packing=true", "train.share_prompt=false")
    wide, lengths = _prediction("train.packing=true", "train.share_prompt=false", "train.micro_batch_tokens=1024")
    assert all(mb.width <= 1024 for mb in lengths.micro_batches())
    # Four longest rows a row: the same tokens, attention over rows four times as wide.
    assert wide.worst_step_time_s.value > default.worst_step_time_s.value


def test_a_compiled_run_says_it_is_priced_as_eager():
    eager, _ = _prediction("train.packing=true")
    compiled, _ = _prediction("train.packing=true", "train.compile=true")
    assert compiled.compiled_as_eager and not eager.compiled_as_eager
    assert compiled.step_time_s == eager.step_time_s
    assert "train.compile priced as eager" in compiled.text() and "compile" not in eager.text()


def test_data_not_read_has_no_predicted_padding(tmp_path):
    cfg = _config("data=hh", f"data.path={tmp_path / 'missing.jsonl'}", "cluster=a100_80gb", "train.packing=true")
    prediction = predict_config(cfg, device_profile(builtin_cluster("a100_80gb")))
    assert prediction.padding_fraction is None and "padding" not in prediction.text()


def _shape(**changes) -> PassShape:
    cfg = _config("train.packing=true")
    return dataclasses.replace(pass_shape(cfg, resolve_plan(cfg, 1), threads=1), **changes)


def test_the_timed_micro_batch_of_a_packed_shape_is_the_forecasts():
    shape = _shape(lengths=tuple(RAGGED), pairs=len(RAGGED), row_tokens=300)
    batch = micro_batch(shape, vocab=50)
    priced = micro_batch_of(RAGGED, shape.share_prompt, 300)
    assert tuple(batch["input_ids"].shape) == (priced.rows, priced.width)
    assert batch["attention_mask"].dtype == torch.bool and batch["attention_mask"].dim() == 4
    padded = micro_batch(dataclasses.replace(shape, packing=False, row_tokens=None), vocab=50)
    assert padded["input_ids"].numel() > batch["input_ids"].numel()


def test_the_pass_cache_keeps_packed_shapes_apart_and_padded_ones_where_they_were():
    packed = _shape(lengths=tuple(RAGGED), pairs=len(RAGGED), row_tokens=300)
    padded = dataclasses.replace(packed, packing=False, row_tokens=None)
    files = {packed.cache_file(), dataclasses.replace(packed, row_tokens=400).cache_file(), padded.cache_file()}
    assert len(files) == 3
    # A padded shape's file is the one it had before packing existed: its cached timings are still read.
    before = {k: v for k, v in dataclasses.asdict(padded).items() if k not in ("packing", "row_tokens")}
    digest = hashlib.sha256(json.dumps([before, torch.__version__, CACHE_VERSION]).encode()).hexdigest()[:20]
    assert padded.cache_file().name == f"{digest}.json"
