"""Run directories with per-pair eval records (eval_pairs.parquet), for the report's tests of ties.

eval_pairs.parquet is written here as the trainer writes it (pyarrow, the agreed columns; INTERFACE.md),
summary.json by support.reports.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpo_sweeps.ranking.eval_pairs import EVAL_PAIRS
from support.reports import resolved_config, write_run


def write_eval_pairs(run_dir: Path, correct: np.ndarray, ids: list[str] | None = None, step: int = 30,
                     reference_free: bool = False, earlier_step: bool = True) -> None:
    """eval_pairs.parquet with one row per pair at `step` (and a worse eval at an earlier step, which the
    report must not read). Log-probs are made up so that `correct` is what they rank."""
    correct = np.asarray(correct, dtype=bool)
    ids = ids or [f"{i:016x}" for i in range(len(correct))]
    margin = np.where(correct, 1.5, -0.5)
    rows = {"step": [], "pair_id": [], "policy_chosen_logps": [], "policy_rejected_logps": [],
            "reference_chosen_logps": [], "reference_rejected_logps": [], "correct": []}
    for at, right, score in ([(step // 2, ~correct, -margin)] if earlier_step else []) + [(step, correct, margin)]:
        rows["step"] += [at] * len(ids)
        rows["pair_id"] += ids
        rows["policy_chosen_logps"] += list(-40.0 + score)
        rows["policy_rejected_logps"] += [-40.0] * len(ids)
        rows["reference_chosen_logps"] += [math.nan if reference_free else -41.0] * len(ids)
        rows["reference_rejected_logps"] += [math.nan if reference_free else -41.0] * len(ids)
        rows["correct"] += list(right)
    schema = pa.schema([("step", pa.int64()), ("pair_id", pa.string()),
                        *((c, pa.float64()) for c in list(rows)[2:6]), ("correct", pa.bool_())])
    pq.write_table(pa.table(rows, schema=schema), run_dir / EVAL_PAIRS)


def write_config_run(sweep: Path, job: int, sharding: str, correct: np.ndarray | None, *, speed: float,
                     accuracy: float | None = None, seed: int = 0, eval_pairs: int | None = None,
                     ids: list[str] | None = None) -> Path:
    """A completed run of fsdp=`sharding` (train.seed=`seed`) whose final eval ranked `correct` right; without
    `correct`, no per-pair records (a run from before them), its accuracy `accuracy` over `eval_pairs` pairs."""
    if accuracy is None:
        accuracy = float(np.mean(correct)) if correct is not None else math.nan
    metrics = {"perf/speed_per_memory": speed, "eval/rewards/accuracies": None if math.isnan(accuracy) else accuracy,
               "steps": 30}
    run_dir = write_run(sweep / str(job), job, [f"fsdp={sharding}", f"train.seed={seed}"],
                        resolved_config(sharding, "bf16", 0.1, 32, seed), status="completed", metrics=metrics)
    if eval_pairs is not None:
        summary = json.loads((run_dir / "summary.json").read_text())
        summary["data"] = {"train_pairs": 1000, "eval_pairs": eval_pairs}
        (run_dir / "summary.json").write_text(json.dumps(summary))
    if correct is not None:
        write_eval_pairs(run_dir, correct, ids)
    return run_dir


def three_configs() -> dict[str, np.ndarray]:
    """Three configs' outcomes on 400 pairs: full_shard the best, shard_grad_op 6 discordant pairs from it (a
    tie), no_shard 60 pairs fewer right (clearly worse)."""
    best = np.zeros(400, dtype=bool)
    best[:300] = True
    close = best.copy()
    close[[0, 1, 2, 3]] = False
    close[[350, 351]] = True
    worse = best.copy()
    worse[:60] = False
    return {"full_shard": best, "shard_grad_op": close, "no_shard": worse}
