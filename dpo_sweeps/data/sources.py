"""Where preference pairs come from: the synthetic task, HH-RLHF, or any prompt/chosen/rejected table.

Every source ends as two lists of `{"prompt", "chosen", "rejected"}` rows, train and eval. A column
holds plain text or a list of `{"role", "content"}` messages (rendered later, see `render_pair`).
Files are read by data/readers.py (every format, one set of rules for its errors); rows that cannot
be a pair are dropped and counted by data/row_checks.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpo_sweeps.config.data_schema import DataConfig, check_eval_size
from dpo_sweeps.data.readers import DATA_SOURCES, LOCAL_SUFFIXES, read_hub, read_table
from dpo_sweeps.data.row_checks import DroppedRows, pair_problem
from dpo_sweeps.data.synthetic import generate_pairs
from dpo_sweeps.errors import DataError, InvalidConfig

log = logging.getLogger(__name__)

HH_PROMPT_END = "\n\nAssistant:"
EVAL_SPLIT_NAMES = ("test", "validation", "eval", "valid")
# data.eval_size=auto: hold out this many pairs, but never more than this share of a small source.
AUTO_EVAL_PAIRS = 256
AUTO_EVAL_FRACTION = 0.2

# A split's records, each with where it was read from ("line 3", "test.jsonl line 3", "test row 3").
Records = list[tuple[str, Any]]


@dataclass
class PreferenceRows:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    eval_source: str  # the source's own split name, or "held out"
    counts: dict[str, int] = field(default_factory=dict)
    # Where each train / eval row was read from, for the rows dropped later (tokenization).
    train_where: list[str] = field(default_factory=list)
    eval_where: list[str] = field(default_factory=list)
    dropped: DroppedRows = field(default_factory=DroppedRows)
    described: str = ""  # how messages name the source


def load_preference_rows(data_cfg: DataConfig, base_dir: Path) -> PreferenceRows:
    """Train and eval rows for `data_cfg`; relative `data.path` values resolve against `base_dir`.

    Rows that cannot be a pair are dropped and counted (`dropped`, row_checks.py); none left is a DataError."""
    if data_cfg.name == "synthetic":
        return _synthetic(data_cfg)
    records, described = _read_source(data_cfg, base_dir)
    if not any(records.values()):
        raise DataError(f"data.path: {described} holds no preference pairs (it is empty; "
                        f"accepted: {DATA_SOURCES} with at least 2 rows)")
    dropped = DroppedRows()
    counts: dict[str, int] = {}
    if data_cfg.name == "hh":
        _require_columns(records, {"chosen": "chosen", "rejected": "rejected"}, described, "data.path")
        splits = {name: _split_hh_dialogues(rows, name, counts, dropped) for name, rows in records.items()}
    else:
        columns = {"data.prompt_column": data_cfg.prompt_column, "data.chosen_column": data_cfg.chosen_column,
                   "data.rejected_column": data_cfg.rejected_column}
        _require_columns(records, columns, described)
        splits = {name: _select_columns(rows, columns, dropped) for name, rows in records.items()}
    if not any(splits.values()):
        raise DataError(f"data.path: no row of {described} is a preference pair; dropped: "
                        f"{dropped.describe_counts()} (accepted: rows with text or message prompt, chosen and "
                        "rejected values, chosen and rejected different)")

    train_name = data_cfg.split if data_cfg.split in splits else None
    eval_name = data_cfg.eval_split if data_cfg.eval_split in splits and data_cfg.eval_split != train_name else None
    if train_name is None:
        if len(splits) != 1:
            raise InvalidConfig("data.split", f"'{data_cfg.split}' is not a split of {described}", ", ".join(sorted(splits)))
        train_name = next(iter(splits))
    train = splits[train_name]
    if eval_name is not None:
        eval_rows, eval_source = splits[eval_name], eval_name
    else:
        train, eval_rows = _hold_out(train, data_cfg.eval_size, data_cfg.split_seed)
        eval_source = "held out"
    if data_cfg.max_pairs is not None:
        train = train[: int(data_cfg.max_pairs)]
    if not train:
        raise DataError(f"data.path: no training pairs left in {described} after filtering (need at least one; "
                        f"dropped: {dropped.describe_counts()})")
    if not eval_rows:
        raise DataError(f"data.eval_size: no held-out pairs from {described} (need at least one)")
    return PreferenceRows(train=[r for _, r in train], eval=[r for _, r in eval_rows], eval_source=eval_source,
                          counts=counts, train_where=[w for w, _ in train], eval_where=[w for w, _ in eval_rows],
                          dropped=dropped, described=described)


def _synthetic(data_cfg: DataConfig) -> PreferenceRows:
    common = dict(
        seed=data_cfg.seed,
        num_topics=data_cfg.num_topics,
        prompt_letters=data_cfg.prompt_letters,
        response_letters=data_cfg.response_letters,
        noise=data_cfg.noise,
    )
    train = generate_pairs(data_cfg.num_train_pairs, stream="train", **common)
    eval_rows = generate_pairs(data_cfg.num_eval_pairs, stream="eval", **common)
    return PreferenceRows(train=train, eval=eval_rows, eval_source="synthetic eval stream",
                          train_where=[f"train pair {i}" for i in range(len(train))],
                          eval_where=[f"eval pair {i}" for i in range(len(eval_rows))], described="synthetic data")


def _read_source(data_cfg: DataConfig, base_dir: Path) -> tuple[dict[str, Records], str]:
    """Records by split name, and how to name the source in messages."""
    path = data_cfg.path
    if not path:
        raise InvalidConfig("data.path", "not set", DATA_SOURCES)
    local = Path(path).expanduser()
    if not local.is_absolute():
        local = base_dir / local
    if local.exists():
        return _read_local(local), f"'{path}'"
    if looks_local(path):
        raise DataError(f"data.path: no such file or folder '{path}' (resolved to {local}; accepted: {DATA_SOURCES})")
    return _read_hub(path, data_cfg.data_dir), f"hub dataset '{path}'"


def looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or path.lower().endswith(LOCAL_SUFFIXES) or path.count("/") > 1


def _read_local(path: Path) -> dict[str, Records]:
    if not path.is_dir():
        table = read_table(path)
        return {"train": list(zip(table.where, table.records))}
    try:
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(LOCAL_SUFFIXES))
    except OSError as exc:
        raise DataError(f"data.path: cannot list folder '{path}' ({exc.strerror}; accepted: {DATA_SOURCES})") from None
    if not files:
        raise DataError(f"data.path: folder '{path}' holds no data files (accepted: {DATA_SOURCES})")
    splits: dict[str, Records] = {}
    for file in files:
        stem = file.name.split(".")[0].lower()
        split = next((s for s in ("train",) + EVAL_SPLIT_NAMES if stem.startswith(s)), "train")
        table = read_table(file)
        splits.setdefault(split, []).extend((f"{file.name} {w}", r) for w, r in zip(table.where, table.records))
    return splits


def _read_hub(name: str, data_dir: str | None) -> dict[str, Records]:
    return {split: list(zip(table.where, table.records)) for split, table in read_hub(name, data_dir).items()}


def split_hh_dialogue(text: str) -> tuple[str, str] | None:
    """(prompt up to and including the last "\\n\\nAssistant:", response), or None without one."""
    cut = text.rfind(HH_PROMPT_END)
    if cut < 0:
        return None
    cut += len(HH_PROMPT_END)
    return text[:cut], text[cut:]


def _split_hh_dialogues(records: Records, split: str, counts: dict[str, int], dropped: DroppedRows) -> Records:
    out: Records = []
    own = DroppedRows()
    for where, row in records:
        chosen, rejected = row.get("chosen"), row.get("rejected")
        problem = pair_problem("", chosen, rejected)
        if problem is None and isinstance(chosen, str) and isinstance(rejected, str):
            chosen, rejected = split_hh_dialogue(chosen), split_hh_dialogue(rejected)
            if chosen is None or rejected is None:
                problem = "no_assistant_turn"
            elif chosen[0] != rejected[0]:
                problem = "no_shared_prompt"
            else:
                problem = pair_problem(chosen[0], chosen[1], rejected[1])
        elif problem is None:
            problem = "not_text"  # HH dialogues are text
        if problem is None:
            out.append((where, {"prompt": chosen[0], "chosen": chosen[1], "rejected": rejected[1]}))
        else:
            own.add(problem, where)
    count = own.counts()
    counts[f"{split}_dropped_prompt_mismatch"] = counts.get(f"{split}_dropped_prompt_mismatch", 0) + count.get(
        "no_shared_prompt", 0)
    counts[f"{split}_dropped_malformed"] = counts.get(f"{split}_dropped_malformed", 0) + sum(
        n for reason, n in count.items() if reason != "no_shared_prompt")
    dropped.update(own)
    return out


def _select_columns(records: Records, columns: dict[str, str], dropped: DroppedRows) -> Records:
    prompt, chosen, rejected = columns.values()
    out: Records = []
    for where, row in records:
        pair = {"prompt": row.get(prompt), "chosen": row.get(chosen), "rejected": row.get(rejected)}
        problem = pair_problem(pair["prompt"], pair["chosen"], pair["rejected"])
        if problem is None:
            out.append((where, pair))
        else:
            dropped.add(problem, where)
    return out


def _require_columns(records: dict[str, Records], columns: dict[str, str], described: str,
                     setting: str | None = None) -> None:
    """A column that no row has is a setting at fault (a row without it is dropped later, one by one)."""
    present: set[str] = set()
    for rows in records.values():
        for _, row in rows:
            present.update(row)
    for key, column in columns.items():
        if column not in present:
            raise DataError(
                f"{setting or key}: column '{column}' not in {described} (columns there: {', '.join(sorted(present))})"
            )


def held_out_count(eval_size: float | int | str, num_rows: int) -> int:
    """How many of `num_rows` pairs `data.eval_size` holds out (`auto`: AUTO_EVAL_PAIRS, at most
    AUTO_EVAL_FRACTION of the rows, at least 1)."""
    check_eval_size(eval_size)
    if eval_size == "auto":
        return max(1, min(AUTO_EVAL_PAIRS, int(AUTO_EVAL_FRACTION * num_rows)))
    return int(round(eval_size * num_rows)) if eval_size < 1 else int(eval_size)


def _hold_out(rows: Records, eval_size: float | int | str, seed: int) -> tuple[Records, Records]:
    """A deterministic split: a seeded permutation, the last `eval_size` rows held out."""
    n_eval = held_out_count(eval_size, len(rows))
    if n_eval >= len(rows):
        raise InvalidConfig(
            "data.eval_size", f"{n_eval} held-out pairs leave no training pairs out of {len(rows)}",
            f"fewer than {len(rows)} pairs, a fraction in (0, 1), or auto",
        )
    if eval_size == "auto" and n_eval < AUTO_EVAL_PAIRS:
        log.info("data.eval_size=auto: holding out %d of %d pairs (%g of a source under %d pairs)", n_eval,
                 len(rows), AUTO_EVAL_FRACTION, int(AUTO_EVAL_PAIRS / AUTO_EVAL_FRACTION))
    order = np.random.default_rng(seed).permutation(len(rows))
    return [rows[i] for i in order[: len(rows) - n_eval]], [rows[i] for i in order[len(rows) - n_eval :]]
