"""eval_pairs.parquet: every held-out pair's scores at every evaluation, beside metrics.jsonl.

One row per (eval step, held-out pair), so that configs scored on the same pairs can be compared pair by
pair (paired tests need the pairs, not only the means):
- `step` (int64): the optimizer step of the evaluation;
- `pair_id` (string): a hash of the pair's token ids (`pair_ids`), equal in every run of the same data and
  tokenizer whatever its sharding, ranks or batch layout;
- `policy_chosen_logps`, `policy_rejected_logps`, `reference_chosen_logps`, `reference_rejected_logps`
  (float64): the summed response log-probs the loss scores (LD-weighted under loss.ld_alpha); the
  reference's are NaN for a loss without one;
- `correct` (bool): the loss's rewards rank chosen above rejected; its mean at a step is that evaluation's
  `eval/rewards/accuracies`.

Rank 0 rewrites the whole file at each evaluation (a temporary file, then a rename: a reader never sees
half of it), that step's rows replacing any it had, so an evaluation repeated after a resume is written
once; a resumed run first drops the rows past its checkpoint, as metrics.jsonl does.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dpo_sweeps.rundir.atomic import temporary_beside
from dpo_sweeps.rundir.paths import writing

log = logging.getLogger(__name__)

EVAL_PAIRS = "eval_pairs.parquet"
VALUE_COLUMNS = ("policy_chosen_logps", "policy_rejected_logps", "reference_chosen_logps", "reference_rejected_logps")
SCHEMA = pa.schema([("step", pa.int64()), ("pair_id", pa.string()), *((c, pa.float64()) for c in VALUE_COLUMNS),
                    ("correct", pa.bool_())])
# What each rank sends rank 0 for every pair it scored, in this order, as a float64 row: the pair's index
# among the held-out pairs (>= their number for a pass's padding), its values, and correct as 0 or 1.
GATHERED = ("pair_index", *VALUE_COLUMNS, "correct")


def pair_ids(pairs: Iterable[tuple[Sequence[int], Sequence[int], Sequence[int]]]) -> list[str]:
    """A 16-hex-digit blake2b of each pair's token ids (prompt, chosen, rejected). A pair that recurs in the
    held-out set has its occurrence number hashed in too: ids stay unique, and runs of the same data agree."""
    ids, seen = [], {}
    for prompt, chosen, rejected in pairs:
        digest = hashlib.blake2b(digest_size=8)
        for tokens in (prompt, chosen, rejected):
            digest.update(len(tokens).to_bytes(8, "little"))
            digest.update(np.asarray(tokens, dtype="<i8").tobytes())
        first = digest.hexdigest()
        repeat = seen.get(first, 0)
        seen[first] = repeat + 1
        if repeat:
            digest.update(f"occurrence {repeat}".encode())
        ids.append(digest.hexdigest())
    return ids


def step_rows(step: int, gathered: np.ndarray, ids: list[str]) -> pa.Table:
    """One evaluation's rows from every rank's `gathered` scores (a GATHERED row each): the padding that
    fills a rank's last pass dropped (index >= pairs), one row per pair, by pair index."""
    real = gathered[gathered[:, 0] < len(ids)]
    _, first = np.unique(real[:, 0].astype(np.int64), return_index=True)  # sorted by pair index
    real = real[first]
    index = real[:, 0].astype(np.int64)
    columns = {"step": np.full(len(index), step, dtype=np.int64), "pair_id": [ids[i] for i in index]}
    columns.update({name: real[:, k + 1] for k, name in enumerate(VALUE_COLUMNS)})
    columns["correct"] = real[:, len(GATHERED) - 1] > 0.5
    return pa.table(columns, schema=SCHEMA)


class EvalPairsLog:
    """Rank 0's eval_pairs.parquet: the rows of the evaluations so far, rewritten whole at each one."""

    def __init__(self, run_dir: Path, ids: list[str]):
        self.path = Path(run_dir) / EVAL_PAIRS
        self.ids = ids
        self.table = self._read()

    def _read(self) -> pa.Table:
        """An earlier attempt's rows; none when there is no file, or one that cannot be read as this file
        (they are written again as the evaluations are redone)."""
        if not self.path.exists():
            return SCHEMA.empty_table()
        try:
            return pq.read_table(self.path, schema=SCHEMA)
        except (OSError, pa.ArrowException) as exc:
            log.warning("%s: cannot read the earlier rows (%s); written anew from this attempt's evaluations",
                        self.path, exc)
            return SCHEMA.empty_table()

    def truncate_after(self, step: int) -> None:
        """Drop rows past `step` (a resumed run evaluates those steps again)."""
        kept = self.table.filter(pc.less_equal(self.table["step"], step))
        if kept.num_rows != self.table.num_rows:
            self.table = kept
            self._write()

    def write(self, step: int, gathered: np.ndarray) -> None:
        """Add (or replace) evaluation `step`'s rows and rewrite the file."""
        earlier = self.table.filter(pc.not_equal(self.table["step"], step))
        self.table = pa.concat_tables([earlier, step_rows(step, gathered, self.ids)])
        self._write()

    def _write(self) -> None:
        tmp = temporary_beside(self.path)
        try:
            with writing(self.path):
                pq.write_table(self.table, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
