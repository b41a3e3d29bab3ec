"""Inputs a new user tries first must not trip the defaults: an empty file, a small file, a broken
JSON Lines row, and the same command run again into a completed run directory."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from support import REPO, run_cli

from dpo_sweeps.data.sources import AUTO_EVAL_PAIRS, held_out_count, load_preference_rows
from dpo_sweeps.errors import DataError, InvalidConfig


def preference_cfg(path, **overrides):
    cfg = OmegaConf.load(REPO / "conf" / "data" / "preference.yaml")
    cfg.path = str(path)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def write_pairs(path, n):
    path.write_text("".join(json.dumps({"prompt": f"q{i}?", "chosen": f" yes {i}", "rejected": f" no {i}"}) + "\n"
                            for i in range(n)))
    return path


def test_an_empty_file_is_a_data_error_naming_it(tmp_path):
    empty = tmp_path / "prefs.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match=r"data.path: '.*prefs.jsonl' holds no preference pairs") as caught:
        load_preference_rows(preference_cfg(empty), tmp_path)
    assert caught.value.kind == "data_error"


def test_a_malformed_row_is_reported_with_its_line_number(tmp_path):
    path = write_pairs(tmp_path / "prefs.jsonl", 3)
    lines = path.read_text().splitlines()
    path.write_text(f"{lines[0]}\n\n{lines[1][:-1]}\n")  # line 3 (after a blank line 2) lost its closing brace
    with pytest.raises(DataError, match=r"'.*prefs.jsonl' line 3, column \d+: not a JSON object"):
        load_preference_rows(preference_cfg(path), tmp_path)


def test_auto_eval_size_shrinks_for_a_small_file_and_an_explicit_one_is_kept():
    assert held_out_count("auto", 200) == 40  # a fifth of a small source
    assert held_out_count("auto", 1) == 1  # at least one pair
    assert held_out_count("auto", 100_000) == AUTO_EVAL_PAIRS
    assert held_out_count(10, 200) == 10 and held_out_count(0.25, 200) == 50
    with pytest.raises(InvalidConfig, match="data.eval_size"):
        held_out_count("some", 200)


def test_an_explicit_eval_size_too_large_for_the_file_is_an_error(tmp_path):
    path = write_pairs(tmp_path / "prefs.jsonl", 200)
    with pytest.raises(InvalidConfig, match=r"data.eval_size: 256 held-out pairs leave no training pairs out of 200"):
        load_preference_rows(preference_cfg(path, eval_size=256), tmp_path)
    rows = load_preference_rows(preference_cfg(path), tmp_path)
    assert (len(rows.train), len(rows.eval)) == (160, 40)


@pytest.mark.slow
def test_a_small_file_trains_with_the_defaults_and_a_completed_run_is_not_trained_again(tmp_path):
    data = write_pairs(tmp_path / "prefs.jsonl", 200)
    run_dir = tmp_path / "run"
    args = ["data=preference", f"data.path={data}", "train.max_steps=2", "train.eval_every=0"]
    first = run_cli(run_dir, *args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.summary["data"]["eval_pairs"] == 40 and first.summary["data"]["train_pairs"] == 160
    assert "holding out 40 of 200 pairs" in first.stdout

    written = {name: (run_dir / name).read_bytes() for name in ("summary.json", "metrics.jsonl")}
    again = run_cli(run_dir, *args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"run already complete: {run_dir / 'summary.json'}" in again.stderr
    assert "dpo_sweeps.train.trainer" not in again.stdout + again.stderr  # no training started
    changed = run_cli(run_dir, *args, "train.lr=0.01")
    assert changed.returncode == 1
    assert "holds a completed run of a different config (train.lr: 0.003 -> 0.01)" in changed.stderr
    assert {name: (run_dir / name).read_bytes() for name in written} == written
