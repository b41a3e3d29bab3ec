"""find_best's recommendation from real run directories (support.eval_records): the fastest per GiB of the
configs tied with the best accuracy, by the report's own paired test; seeds of a config decided together;
find_best.json's older files still read by the report; hydra.sweeper.stages.replicates checked."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.eval_records import write_config_run

from dpo_sweeps.analysis.recommendation import Recommendation, recommendation_html, recommendation_lines
from dpo_sweeps.launchers.find_best import Stages
from dpo_sweeps.launchers.find_best_answer import Decision, by_peft, candidates_of, recommendation_text
from dpo_sweeps.launchers.preflight import InvalidSweep


def _outcomes(pairs: int = 400) -> dict[str, np.ndarray]:
    """full_shard the best; shard_grad_op 2 pairs fewer right of 6 discordant (tied); no_shard 60 fewer (worse)."""
    best = np.zeros(pairs, dtype=bool)
    best[: int(0.75 * pairs)] = True
    close = best.copy()
    close[[0, 1, 2, 3]] = False
    close[[pairs - 50, pairs - 49]] = True
    worse = best.copy()
    worse[:60] = False
    return {"full_shard": best, "shard_grad_op": close, "no_shard": worse}


def _candidates(tmp_path, speeds: dict[str, float]):
    dirs = [write_config_run(tmp_path, job, sharding, correct, speed=speeds[sharding], eval_pairs=400)
            for job, (sharding, correct) in enumerate(_outcomes().items())]
    return candidates_of([(d, None) for d in dirs]), dirs


def test_the_pick_is_the_fastest_config_tied_with_the_best_not_the_fastest_overall(tmp_path):
    # no_shard is the fastest per GiB but significantly worse; shard_grad_op is tied with the best and faster.
    candidates, (best, close, worse) = _candidates(tmp_path, {"full_shard": 100.0, "shard_grad_op": 150.0,
                                                               "no_shard": 200.0})
    decision = Decision.of(candidates)
    rec = decision.recommendation()
    assert rec["run"] == str(close) and rec["command"].endswith("fsdp=shard_grad_op train.seed=0")
    assert sorted(rec["tied_with_best"]) == sorted([str(best), str(close)])
    assert rec["best_accuracy_run"] == str(best) and rec["decided_by"] == "training stage"
    low, high = rec["accuracy_ci95"]
    assert low < rec["eval/rewards/accuracies"] < high
    records = {r["run"]: r for r in decision.candidate_records()}
    assert [records[str(d)]["tied_with_best"] for d in (best, close, worse)] == [True, True, False]
    assert [records[str(d)]["rank_with_ties"] for d in (best, close, worse)] == [1, 1, 3]
    assert records[str(best)]["diff_vs_best"] == 0.0 and records[str(best)]["p_vs_best_adjusted"] is None
    assert records[str(worse)]["diff_vs_best"] == pytest.approx(-60 / 400)
    json.dumps({"recommendation": rec, "candidates": list(records.values())}, allow_nan=False)  # as written

    text = recommendation_text({"stages": {}, "recommendation": rec, "by_peft": by_peft(candidates)})
    assert "the fastest per GiB of 2 config(s) tied with the best accuracy; decided by the training stage" in text


def test_seeds_of_one_config_are_one_candidate_decided_on_together(tmp_path):
    outcomes = _outcomes()
    first = write_config_run(tmp_path, 0, "full_shard", outcomes["full_shard"], speed=100.0)
    other = write_config_run(tmp_path, 1, "shard_grad_op", outcomes["shard_grad_op"], speed=150.0)
    again = write_config_run(tmp_path, 2, "full_shard", outcomes["full_shard"], speed=110.0, seed=1)
    candidates = candidates_of([(first, None), (other, None), (again, None)])
    assert [c.runs for c in candidates] == [[first, again], [other]]
    assert candidates[0].speed_per_memory == pytest.approx(105.0) and candidates[0].first_seed == 0
    rec = Decision.of(candidates, "replicates stage, 2 seeds").recommendation()
    assert rec["runs"] == [str(other)] and rec["decided_by"] == "replicates stage, 2 seeds"
    assert len(rec["tied_with_best"]) == 2


def test_the_report_reads_find_best_json_old_and_new(tmp_path):
    candidates, _ = _candidates(tmp_path, {"full_shard": 100.0, "shard_grad_op": 150.0, "no_shard": 200.0})
    new = Decision.of(candidates).recommendation()
    lines = "\n".join(recommendation_lines(Recommendation(tmp_path, {}, new, [])))
    assert "tied with the best accuracy (not significantly worse on the held-out pairs), decided by the training stage" in lines
    old = {"run": "r/0", "overrides": ["fsdp=full_shard"], "command": "python -m dpo_sweeps fsdp=full_shard",
           "eval/rewards/accuracies": 0.91, "accuracy_spread": 0.017, "perf/speed_per_memory": 100.0,
           "within_spread_of_best": ["r/0", "r/1"], "best_accuracy_run": "r/0"}
    lines = "\n".join(recommendation_lines(Recommendation(tmp_path, {}, old, [])))
    assert "0.910 ± 0.017" in lines and "of the 2 run(s) within its spread" in lines
    page = recommendation_html(Recommendation(tmp_path, {}, old, []), str)
    assert "Best accuracy, then the fastest per GiB of the 2 run(s) within its spread" in page


STAGES = {"systems": {"precision": "fp32"}, "algorithm": {"loss.beta": "0.1"}}


def test_replicates_is_a_whole_number_of_seeds():
    assert Stages.of(STAGES).replicates == 0
    assert Stages.of({**STAGES, "replicates": 3}).replicates == 3
    for bad in (-1, 2.5, "3", True, None):
        with pytest.raises(InvalidSweep, match=r"^hydra.sweeper.stages.replicates: got .* \(accepted: an integer >= 0"):
            Stages.of({**STAGES, "replicates": bad})
