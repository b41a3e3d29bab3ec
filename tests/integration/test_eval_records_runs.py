"""eval_pairs.parquet through the real CLI: every held-out pair's scores at every evaluation, gathered from
the ranks by rank 0, lined up across runs by pair_id, written once through a resume."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest
from support import run_cli

# 2 ranks, 37 held-out pairs (an odd number: the last round of passes is padded), evaluated at 3 and 6.
TWO_RANKS = ["resources.nproc_per_node=2", "train.max_steps=6", "train.eval_every=3", "train.batch_size=16",
             "train.micro_batch_size=4", "train.warmup_steps=2", "data.num_train_pairs=256",
             "data.num_eval_pairs=37", "perf.warmup_steps=1"]
HELD_OUT = 37


def _rows(result) -> list[dict]:
    assert result.returncode == 0, result.stderr[-3000:]
    return pq.read_table(result.run_dir / "eval_pairs.parquet").to_pylist()


def _evals(result) -> dict[int, dict]:
    return {r["step"]: r for r in result.records if "eval/rewards/accuracies" in r}


def _check_rows_follow_the_evals(result) -> list[dict]:
    rows, evals = _rows(result), _evals(result)
    assert sorted({r["step"] for r in rows}) == sorted(evals)
    for step, record in evals.items():
        at_step = [r for r in rows if r["step"] == step]
        assert len(at_step) == HELD_OUT and len({r["pair_id"] for r in at_step}) == HELD_OUT
        # The per-pair quantity the logged accuracy averages, exactly.
        assert sum(r["correct"] for r in at_step) / HELD_OUT == record["eval/rewards/accuracies"]
    return rows


def test_a_two_rank_run_writes_one_row_per_held_out_pair_per_eval(tmp_path):
    result = run_cli(tmp_path / "run", *TWO_RANKS)
    rows = _check_rows_follow_the_evals(result)
    assert result.summary["metrics"]["eval/rewards/accuracies"] == _evals(result)[6]["eval/rewards/accuracies"]
    for r in rows:
        assert all(math.isfinite(r[k]) for k in ("policy_chosen_logps", "policy_rejected_logps",
                                                  "reference_chosen_logps", "reference_rejected_logps"))
    first = {r["pair_id"]: r for r in rows if r["step"] == 3}
    last = {r["pair_id"]: r for r in rows if r["step"] == 6}
    assert first.keys() == last.keys()
    # The reference is frozen: its log-probs are the same at every evaluation; the policy's move.
    assert all(first[i]["reference_chosen_logps"] == last[i]["reference_chosen_logps"] for i in first)
    assert any(first[i]["policy_chosen_logps"] != last[i]["policy_chosen_logps"] for i in first)


@pytest.mark.slow
def test_runs_of_another_strategy_eval_batching_and_loss_line_up_by_pair_id(tmp_path):
    full_shard = _check_rows_follow_the_evals(run_cli(tmp_path / "full_shard", *TWO_RANKS))
    # Other passes (3 pairs each) and another sharding: the same pairs, the same ids, the same reference.
    other = _check_rows_follow_the_evals(run_cli(tmp_path / "shard_grad_op", *TWO_RANKS, "fsdp=shard_grad_op",
                                                 "train.eval_micro_batch_size=3"))
    assert [r["pair_id"] for r in other] == [r["pair_id"] for r in full_shard]
    for a, b in zip(full_shard, other):
        assert a["reference_chosen_logps"] == pytest.approx(b["reference_chosen_logps"], rel=1e-5)
    # A loss without a reference (SimPO), on one rank: the same ids, NaN reference columns.
    simpo = _check_rows_follow_the_evals(run_cli(tmp_path / "simpo", *TWO_RANKS, "resources.nproc_per_node=1",
                                                 "loss=simpo"))
    assert [r["pair_id"] for r in simpo] == [r["pair_id"] for r in full_shard]
    assert all(math.isnan(r["reference_chosen_logps"]) and math.isnan(r["reference_rejected_logps"]) for r in simpo)


@pytest.mark.slow
def test_a_crashed_and_resumed_run_writes_each_evaluation_once(tmp_path):
    """Evaluated at 2 and 4, a checkpoint at 3, rank 1 crashes in step 6: the resumed attempt starts at 3,
    evaluates 4 again, and the file holds every evaluation's pairs once."""
    run_dir = tmp_path / "run"
    overrides = [*TWO_RANKS, "train.max_steps=8", "train.eval_every=2", "checkpoint.every_steps=3",
                 "faults.kind=crash", "faults.rank=1", "faults.step=6"]
    crashed = run_cli(run_dir, *overrides)
    assert crashed.returncode == 1 and crashed.summary["failure"]["kind"] == "crash"
    assert sorted({r["step"] for r in _rows_of(run_dir)}) == [2, 4]
    resumed = run_cli(run_dir, *overrides)
    assert resumed.summary["resumed_from_step"] == 3
    rows = _check_rows_follow_the_evals(resumed)
    assert sorted({r["step"] for r in rows}) == [2, 4, 6, 8]
    assert len(rows) == 4 * HELD_OUT and len({(r["step"], r["pair_id"]) for r in rows}) == len(rows)


def _rows_of(run_dir) -> list[dict]:
    return pq.read_table(run_dir / "eval_pairs.parquet").to_pylist()


def test_a_bad_eval_micro_batch_size_is_refused_in_one_line(tmp_path):
    result = run_cli(tmp_path / "run", "train.eval_micro_batch_size=0", timeout=120)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ("train.eval_micro_batch_size: got 0 (accepted: an integer >= 1, or null for as many "
                                 "as fit in a training micro-batch's memory)") in errors[0], result.stderr[-2000:]
    assert result.summary["failure"]["kind"] == "invalid_config"
    assert not (tmp_path / "run" / "eval_pairs.parquet").exists()
