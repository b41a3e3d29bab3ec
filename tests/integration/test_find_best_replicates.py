"""Stage 4 of the staged search, `hydra.sweeper.stages.replicates: K`: when more than one config is tied with
the best after stage 3, each tied config trains K-1 more seeds into the same sweep directory, the pick is made
again on every seed, and a rerun of the same command reuses what completed."""

from __future__ import annotations

import json

import pytest
from support.sweeps import run_sweep

# One plan probed for 3 steps, then two betas trained for 4 steps on it and scored on 16 held-out pairs: too
# few to tell them apart, so both are tied with the best and stage 4 runs.
TINY_REPLICATES = ["resources.nproc_per_node=1", "train.max_steps=4", "perf.warmup_steps=1",
                   "data.num_train_pairs=64", "data.num_eval_pairs=16",
                   "hydra.sweeper.stages={systems: {precision: fp32}, algorithm: {loss.beta: '0.1,0.5'}, "
                   "probe_steps: 3, top_k: 1, replicates: 2}"]


def _summaries(folder) -> dict[str, dict]:
    return {p.name: json.loads((p / "summary.json").read_text()) for p in sorted(folder.iterdir())}


@pytest.mark.slow
def test_tied_configs_train_more_seeds_and_the_pick_is_made_again_on_every_seed(tmp_path):
    sweep_dir = tmp_path / "find_best"
    result = run_sweep(sweep_dir, *TINY_REPLICATES)
    assert result.returncode == 0, result.output[-3000:]

    trained = _summaries(sweep_dir / "train")
    replicates = _summaries(sweep_dir / "replicates")
    assert sorted(trained) == ["1", "2"] and sorted(replicates) == ["3", "4"]  # numbered after stage 3
    # Every tied config again, with a seed other than its first.
    first_seed = {s["config"]["loss"]["beta"]: s["config"]["train"]["seed"] for s in trained.values()}
    assert sorted(s["config"]["loss"]["beta"] for s in replicates.values()) == [0.1, 0.5]
    for summary in replicates.values():
        assert summary["status"] == "completed"
        assert summary["config"]["train"]["seed"] == first_seed[summary["config"]["loss"]["beta"]] + 1

    answer = json.loads((sweep_dir / "find_best.json").read_text())
    rec = answer["recommendation"]
    assert answer["decided_by"] == rec["decided_by"] == "replicates stage, 2 seeds"
    assert answer["stages"]["replicates"]["runs"] == 2 and answer["stages"]["replicates"]["completed"] == 2
    # Each config is one candidate of two seeds: its training run first, then its replicate.
    assert [len(c["runs"]) for c in answer["candidates"]] == [2, 2]
    assert all(c["runs"][0].split("/")[-2] == "train" and c["runs"][1].split("/")[-2] == "replicates"
               for c in answer["candidates"])
    assert rec["run"] in rec["tied_with_best"] and len(rec["runs"]) == 2
    assert "decided by the replicates stage, 2 seeds" in result.stdout

    # The same command again: every run is reused, nothing new is trained, the decision is the same.
    again = run_sweep(sweep_dir, *TINY_REPLICATES)
    assert again.returncode == 0, again.output[-3000:]
    assert _summaries(sweep_dir / "replicates") == replicates and _summaries(sweep_dir / "train") == trained
    assert json.loads((sweep_dir / "find_best.json").read_text())["recommendation"] == rec


def test_a_replicates_value_that_is_not_a_number_of_seeds_is_refused_before_anything_runs(tmp_path):
    result = run_sweep(tmp_path / "fb", "hydra.sweeper.stages={systems: {precision: fp32}, "
                       "algorithm: {loss.beta: '0.1'}, replicates: -1}", timeout=300)
    assert result.returncode != 0 and not (tmp_path / "fb").exists()
    assert ("hydra.sweeper.stages.replicates: got -1 (accepted: an integer >= 0, the seeds each config tied with "
            "the best trains; 0 or 1: no replicates stage)") in result.output, result.output[-2000:]
