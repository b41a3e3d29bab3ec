"""Where preference pairs come from: the synthetic task, HH-RLHF, or any prompt/chosen/rejected table.

Every source ends as two lists of `{"prompt", "chosen", "rejected"}` rows, train and eval. A column
holds plain text or a list of `{"role", "content"}` messages (rendered later, see `render_pair`).
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from dpo_sweeps.data.synthetic import generate_pairs
from dpo_sweeps.errors import DataError, InvalidConfig

log = logging.getLogger(__name__)

HH_PROMPT_END = "\n\nAssistant:"
LOCAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
EVAL_SPLIT_NAMES = ("test", "validation", "eval", "valid")
DATA_SOURCES = "a local .jsonl/.jsonl.gz/.json/.parquet file, a folder of them, or a hub dataset name"
# data.eval_size=auto: hold out this many pairs, but never more than this share of a small source.
AUTO_EVAL_PAIRS = 256
AUTO_EVAL_FRACTION = 0.2


@dataclass
class PreferenceRows:
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    eval_source: str  # the source's own split name, or "held out"
    counts: dict[str, int] = field(default_factory=dict)


def load_preference_rows(data_cfg: DictConfig, base_dir: Path) -> PreferenceRows:
    """Train and eval rows for `data_cfg`; relative `data.path` values resolve against `base_dir`."""
    if data_cfg.name == "synthetic":
        return _synthetic(data_cfg)
    splits, described = _read_source(data_cfg, base_dir)
    if not any(splits.values()):
        raise DataError(f"data.path: {described} holds no preference pairs (it is empty; "
                        f"accepted: {DATA_SOURCES} with at least 2 rows)")
    if data_cfg.name == "hh":
        counts: dict[str, int] = {}
        splits = {name: _split_hh_dialogues(rows, name, described, counts) for name, rows in splits.items()}
    else:
        counts = {}
        splits = {name: _select_columns(rows, data_cfg, described) for name, rows in splits.items()}

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
        raise DataError(f"data.path: no training pairs left in {described} after filtering (need at least one)")
    if not eval_rows:
        raise DataError(f"data.eval_size: no held-out pairs from {described} (need at least one)")
    return PreferenceRows(train=train, eval=eval_rows, eval_source=eval_source, counts=counts)


def _synthetic(data_cfg: DictConfig) -> PreferenceRows:
    common = dict(
        seed=data_cfg.seed,
        num_topics=data_cfg.num_topics,
        prompt_letters=data_cfg.prompt_letters,
        response_letters=data_cfg.response_letters,
        noise=data_cfg.noise,
    )
    return PreferenceRows(
        train=generate_pairs(data_cfg.num_train_pairs, stream="train", **common),
        eval=generate_pairs(data_cfg.num_eval_pairs, stream="eval", **common),
        eval_source="synthetic eval stream",
    )


def _read_source(data_cfg: DictConfig, base_dir: Path) -> tuple[dict[str, list[dict]], str]:
    """Rows by split name, and how to name the source in messages."""
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
    return path.startswith((".", "/", "~")) or path.endswith(LOCAL_SUFFIXES) or path.count("/") > 1


def _read_local(path: Path) -> dict[str, list[dict]]:
    if path.is_file():
        return {"train": _read_file(path)}
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(LOCAL_SUFFIXES))
    if not files:
        raise DataError(f"data.path: folder '{path}' holds no {', '.join(LOCAL_SUFFIXES)} files")
    splits: dict[str, list[dict]] = {}
    for file in files:
        stem = file.name.split(".")[0].lower()
        split = next((s for s in ("train",) + EVAL_SPLIT_NAMES if stem.startswith(s)), "train")
        splits.setdefault(split, []).extend(_read_file(file))
    return splits


def _read_file(path: Path) -> list[dict]:
    name = path.name
    try:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            if ".jsonl" in name:
                return _read_json_lines(f, path)
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise DataError(f"data.path: cannot read '{path}' ({type(exc).__name__}: {exc})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(f"data.path: '{path}' is not a JSON list of rows (accepted: JSON Lines, a JSON list, Parquet)")
    return data


def _read_json_lines(lines, path: Path) -> list[dict]:
    """One row per non-blank line; a malformed row is reported with its line number in the file."""
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            column = f", column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise DataError(f"data.path: '{path}' line {number}{column}: not a JSON object ({reason}; "
                            "accepted: JSON Lines, one JSON object per line)") from None
    return rows


def _read_hub(name: str, data_dir: str | None) -> dict[str, list[dict]]:
    import datasets

    try:
        loaded = datasets.load_dataset(name, data_dir=data_dir)
    except Exception as exc:  # the hub client raises many types; all mean "not available"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"data.path: cannot load hub dataset '{name}' ({first}); accepted: {DATA_SOURCES}") from None
    return {split: list(ds) for split, ds in loaded.items()}


def split_hh_dialogue(text: str) -> tuple[str, str] | None:
    """(prompt up to and including the last "\\n\\nAssistant:", response), or None without one."""
    cut = text.rfind(HH_PROMPT_END)
    if cut < 0:
        return None
    cut += len(HH_PROMPT_END)
    return text[:cut], text[cut:]


def _split_hh_dialogues(rows: list[dict], split: str, described: str, counts: dict[str, int]) -> list[dict]:
    _require_columns(rows, {"chosen": "chosen", "rejected": "rejected"}, described, "data.path")
    out, mismatched, malformed = [], 0, 0
    for row in rows:
        chosen, rejected = split_hh_dialogue(row["chosen"]), split_hh_dialogue(row["rejected"])
        if chosen is None or rejected is None:
            malformed += 1
        elif chosen[0] != rejected[0]:
            mismatched += 1
        else:
            out.append({"prompt": chosen[0], "chosen": chosen[1], "rejected": rejected[1]})
    if mismatched or malformed:
        log.info(
            "hh %s: dropped %d pairs whose chosen and rejected prompts differ and %d without '\\n\\nAssistant:'",
            split, mismatched, malformed,
        )
    counts[f"{split}_dropped_prompt_mismatch"] = counts.get(f"{split}_dropped_prompt_mismatch", 0) + mismatched
    counts[f"{split}_dropped_malformed"] = counts.get(f"{split}_dropped_malformed", 0) + malformed
    return out


def _select_columns(rows: list[dict], data_cfg: DictConfig, described: str) -> list[dict]:
    columns = {
        "data.prompt_column": data_cfg.prompt_column,
        "data.chosen_column": data_cfg.chosen_column,
        "data.rejected_column": data_cfg.rejected_column,
    }
    _require_columns(rows, columns, described)
    return [
        {"prompt": row[columns["data.prompt_column"]], "chosen": row[columns["data.chosen_column"]],
         "rejected": row[columns["data.rejected_column"]]}
        for row in rows
    ]


def _require_columns(rows: list[dict], columns: dict[str, str], described: str, setting: str | None = None) -> None:
    if not rows:
        return
    present = set(rows[0])
    for key, column in columns.items():
        if column not in present:
            raise DataError(
                f"{setting or key}: column '{column}' not in {described} (columns there: {', '.join(sorted(present))})"
            )


def check_eval_size(eval_size: Any) -> None:
    if eval_size == "auto":
        return
    if isinstance(eval_size, bool) or not isinstance(eval_size, (int, float)) or eval_size <= 0:
        raise InvalidConfig("data.eval_size", f"got {eval_size!r}",
                            "auto, a number of pairs >= 1 or a fraction in (0, 1)")


def held_out_count(eval_size: float | int | str, num_rows: int) -> int:
    """How many of `num_rows` pairs `data.eval_size` holds out (`auto`: AUTO_EVAL_PAIRS, at most
    AUTO_EVAL_FRACTION of the rows, at least 1)."""
    check_eval_size(eval_size)
    if eval_size == "auto":
        return max(1, min(AUTO_EVAL_PAIRS, int(AUTO_EVAL_FRACTION * num_rows)))
    return int(round(eval_size * num_rows)) if eval_size < 1 else int(eval_size)


def _hold_out(rows: list[dict], eval_size: float | int | str, seed: int) -> tuple[list[dict], list[dict]]:
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
