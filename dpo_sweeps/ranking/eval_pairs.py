"""A run's per-pair eval records (`<run_dir>/eval_pairs.parquet`), read for paired comparisons.

One row per (eval step, held-out pair): `step`, `pair_id` (a hash of the pair's token ids, the same in
every run of a sweep for the same pair), the policy's and the reference's summed response log-probs of
chosen and rejected, and `correct` (the pair ranked right: the per-pair quantity whose mean is
`eval/rewards/accuracies`). The training side writes it; the report reads only the final eval (the
rows of the largest step).

Each pair also gets one continuous score: the policy-vs-reference log-ratio margin
(pc - rc) - (pr - rr), which is DPO's reward margin divided by beta and so comparable across beta;
reference-free losses (NaN reference columns) fall back to the policy margin pc - pr.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The file's name and columns are its writer's (rundir/eval_pairs.py), read here as written there.
from dpo_sweeps.rundir.eval_pairs import EVAL_PAIRS
from dpo_sweeps.rundir.eval_pairs import VALUE_COLUMNS as LOGP_COLUMNS

COLUMNS = ("step", "pair_id", *LOGP_COLUMNS, "correct")

LOG_RATIO_MARGIN = "log-ratio margin"
POLICY_MARGIN = "policy margin"


class EvalPairsUnreadable(ValueError):
    """eval_pairs.parquet exists but cannot be read as the agreed columns."""


@dataclass(frozen=True)
class FinalEval:
    """The final eval of one run: per held-out pair, whether it was ranked right and its margin."""

    step: int
    pair_ids: np.ndarray  # str, unique, sorted
    correct: np.ndarray  # bool
    score: np.ndarray  # float64: the log-ratio margin, or the policy margin (`score_name`)
    score_name: str
    # Pairs of the final eval left out because the policy's log-probs are NaN (a diverged run).
    nan_pairs: int = 0

    def __len__(self) -> int:
        return len(self.pair_ids)


def read_final_eval(run_dir: Path) -> FinalEval | None:
    """The rows of the largest step of `run_dir`'s eval_pairs.parquet; None when the run wrote none.

    Raises EvalPairsUnreadable for a file without the agreed columns or that pyarrow cannot read.
    """
    path = Path(run_dir) / EVAL_PAIRS
    if not path.is_file():
        return None
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=list(COLUMNS))
    except Exception as error:  # noqa: BLE001 (pyarrow raises its own types and KeyError for a column)
        raise EvalPairsUnreadable(f"{EVAL_PAIRS} is not readable ({type(error).__name__}: {error})") from error
    if table.num_rows == 0:
        raise EvalPairsUnreadable(f"{EVAL_PAIRS} holds no rows")
    steps = table.column("step").to_numpy()
    last = int(steps.max())
    keep = steps == last
    ids = np.asarray(table.column("pair_id").to_pylist(), dtype=object)[keep].astype(str)
    logps = {name: table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)[keep] for name in LOGP_COLUMNS}
    correct = np.asarray(table.column("correct").to_numpy(zero_copy_only=False), dtype=bool)[keep]
    # An eval repeated after a resume may write a pair twice: keep its last row.
    reversed_unique = np.unique(ids[::-1], return_index=True)[1]
    order = len(ids) - 1 - reversed_unique  # sorted by pair id
    ids, correct = ids[order], correct[order]
    logps = {name: values[order] for name, values in logps.items()}
    policy = logps["policy_chosen_logps"] - logps["policy_rejected_logps"]
    reference = logps["reference_chosen_logps"] - logps["reference_rejected_logps"]
    reference_free = bool(np.isnan(reference).all())
    score = policy if reference_free else policy - reference
    finite = np.isfinite(score)
    return FinalEval(last, ids[finite], correct[finite], score[finite],
                     POLICY_MARGIN if reference_free else LOG_RATIO_MARGIN, nan_pairs=int((~finite).sum()))


@dataclass(frozen=True)
class PairRecords:
    """A config's final evals lined up by pair: the pairs every one of its seeds scored, one column per seed."""

    pair_ids: np.ndarray  # str, sorted
    correct: np.ndarray  # (pairs, seeds) float 0/1
    score: np.ndarray  # (pairs, seeds) float64
    score_name: str
    # The most pairs any one seed scored: above len(pair_ids) when the seeds' held-out pairs differ.
    most_pairs: int

    @property
    def seeds(self) -> int:
        return self.correct.shape[1]


def config_records(evals: list[FinalEval]) -> PairRecords | None:
    """The seeds' final evals on the pairs they share; None when there are none or their scores differ in kind."""
    if not evals or len({e.score_name for e in evals}) != 1:
        return None
    shared = evals[0].pair_ids
    for e in evals[1:]:
        shared = np.intersect1d(shared, e.pair_ids, assume_unique=True)
    columns = [np.searchsorted(e.pair_ids, shared) for e in evals]
    correct = np.stack([e.correct[c].astype(np.float64) for e, c in zip(evals, columns)], axis=1)
    score = np.stack([e.score[c] for e, c in zip(evals, columns)], axis=1)
    return PairRecords(shared, correct, score, evals[0].score_name, max(len(e) for e in evals))


def shared_rows(a: PairRecords, b: PairRecords) -> tuple[np.ndarray, np.ndarray]:
    """Row indices into `a` and `b` of the pairs both scored, in the same order."""
    _, rows_a, rows_b = np.intersect1d(a.pair_ids, b.pair_ids, assume_unique=True, return_indices=True)
    return rows_a, rows_b
