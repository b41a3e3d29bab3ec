"""The forecast reads the run's own pairs (dpo_sweeps/cost/data_lengths.py): their lengths as the run
tokenizes them, batched and padded as its collator will; the step is expected from them, with the worst
case (every row at data.max_length) beside it."""

from __future__ import annotations

from collections import Counter

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.config.schema import Config
from dpo_sweeps.cost.data_lengths import micro_batch_of, sampled_pair_lengths, simulated_steps
from dpo_sweeps.cost.predict import device_profile, predict_config, total_text
from dpo_sweeps.cost.profile import builtin_cluster

HH = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
HH_RUN = ["model=bench_gpt2", "data=hh", f"data.path={HH}", "data.eval_split=null", "data.eval_size=16"]


def _config(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return Config.of(OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True))


@pytest.mark.skipif(not HH.is_file(), reason="the HH pairs of ../shared/data are not here")
def test_the_sampled_pairs_are_tokenized_and_truncated_exactly_as_the_run_tokenizes_them():
    from dpo_sweeps.train.setup import _load_and_encode

    cfg = _config(*HH_RUN, "data.max_length=128", "data.max_prompt_length=64")
    sampled, total = sampled_pair_lengths(cfg, REPO)
    run = _load_and_encode(cfg, REPO).train_pairs
    assert len(sampled) == 256 and total >= len(run) > 256
    # Every sampled pair is one of the run's pairs, token for token in its lengths.
    left = Counter((len(p.prompt), len(p.chosen), len(p.rejected)) for p in run) - Counter(sampled)
    assert sum(left.values()) == len(run) - len(sampled)
    # Truncated as the run truncates: no prompt past data.max_prompt_length where the pair was too long.
    assert max(p + max(c, r) for p, c, r in sampled) <= 128
    assert min(c for _, c, _ in sampled) < 32  # HH is ragged: short responses stay short


def test_each_micro_batch_is_padded_to_its_own_longest_row_in_both_row_layouts():
    pairs = [(10, 5, 7), (3, 20, 2)]
    apart, shared = micro_batch_of(pairs, share_prompt=False), micro_batch_of(pairs, share_prompt=True)
    assert (apart.rows, apart.width, apart.response_tokens) == (4, 23, 34)
    assert (shared.rows, shared.width, shared.response_tokens) == (2, 25, 34)


def test_length_grouped_batches_carry_less_padding_than_shuffled_ones():
    pairs = [(8, 4 + (37 * i) % 120, 4 + (53 * i) % 100) for i in range(256)]

    def padded(*overrides: str) -> int:
        cfg = _config("train.batch_size=8", "train.micro_batch_size=2", *overrides)
        return sum(mb.positions for step in simulated_steps(pairs, cfg, 2) for ranks in step for mb in ranks)

    grouped, shuffled = padded("data.length_grouped=true"), padded("data.length_grouped=false")
    assert grouped < 0.9 * shuffled
    cfg = _config("train.batch_size=8", "train.micro_batch_size=2")
    steps = simulated_steps(pairs, cfg, 2)
    assert len(steps) == 256 // 8 and all(len(step) == 2 and len(step[0]) == 2 for step in steps)


@pytest.mark.skipif(not HH.is_file(), reason="the HH pairs of ../shared/data are not here")
def test_ragged_data_is_expected_faster_than_its_worst_case_on_a_gpu_profile_and_the_total_uses_the_expected():
    cfg = _config(*HH_RUN, "data.max_length=1024", "data.max_prompt_length=512", "cluster=h100_sxm",
                  "train.batch_size=16", "train.micro_batch_size=8", "train.max_steps=100")
    prediction = predict_config(cfg, device_profile(cfg.cluster))
    assert prediction.expected and prediction.lengths_from.startswith("256 of ")
    expected, worst = prediction.step_time_s, prediction.worst_step_time_s
    assert expected.low < expected.value < expected.high
    assert expected.value < 0.8 * worst.value  # most HH pairs are far shorter than 1,024 tokens
    assert prediction.device_hours.value == pytest.approx(expected.value * 100 / 3600)
    assert prediction.worst_device_hours.value == pytest.approx(worst.value * 100 / 3600)
    assert "s expected (worst case" in prediction.text()
    total = total_text([prediction, prediction])
    assert f"{2 * prediction.device_hours.value:.3g} device-hours" in total
    assert "expected from the data's lengths" in total
    assert f"worst case (every row at data.max_length): {2 * prediction.worst_device_hours.value:.3g}" in total


def test_data_that_cannot_be_read_is_priced_at_its_worst_case_saying_why(tmp_path):
    cfg = _config("data=hh", f"data.path={tmp_path / 'missing.jsonl'}", "cluster=a100_80gb")
    prediction = predict_config(cfg, device_profile(builtin_cluster("a100_80gb")))
    assert not prediction.expected and prediction.step_time_s == prediction.worst_step_time_s
    assert "data.path" in prediction.lengths_reason and "at the worst case" in prediction.text()
    assert "1 of them at their worst case (the data's lengths could not be read" in total_text([prediction])
