"""Data files as users have them: every format read under the same rules, every failure one DataError
naming the file, the format, the line or row, and what is accepted; rows that are no pair dropped and counted."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.data.readers import ACCEPTED_FORMATS
from dpo_sweeps.data.sources import load_preference_rows
from dpo_sweeps.errors import DataError

PAIRS = [{"prompt": f"q{i}?", "chosen": f" yes {i}", "rejected": f" no {i}"} for i in range(20)]
JSONL = "".join(json.dumps(r) + "\n" for r in PAIRS)
CSV = "prompt,chosen,rejected\r\n" + "".join(f'{r["prompt"]},"{r["chosen"]}",{r["rejected"]}\r\n' for r in PAIRS)


def load(path, **overrides):
    cfg = OmegaConf.load(REPO / "conf" / "data" / ("hh.yaml" if overrides.pop("hh", False) else "preference.yaml"))
    cfg.path, cfg.eval_size, cfg.eval_split = str(path), 2, None
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return load_preference_rows(cfg, path.parent)


def parquet_bytes(rows) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue().to_pybytes()


READABLE = {
    "prefs.csv": CSV.encode(),
    "bom.csv": b"\xef\xbb\xbf" + CSV.encode(),
    "excel.tsv": CSV.replace(",", "\t").encode("utf-16"),  # Excel's "Unicode text": UTF-16 with a BOM
    "crlf.jsonl": JSONL.replace("\n", "\r\n").encode(),
    "bom.jsonl": b"\xef\xbb\xbf" + JSONL.encode(),
    "datasets_export.json": JSONL.encode(),  # datasets' to_json writes JSON Lines
    "list.json": json.dumps(PAIRS).encode(),
    "prefs.jsonl.xz": lzma.compress(JSONL.encode()),
    "prefs.csv.bz2": bz2.compress(CSV.encode()),
    "gzipped_but_named.jsonl": gzip.compress(JSONL.encode()),
    "prefs.parquet": parquet_bytes(PAIRS),
    "no_suffix": JSONL.encode(),
}


@pytest.mark.parametrize("name", sorted(READABLE))
def test_every_format_and_encoding_users_have_reads_the_same_pairs(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(READABLE[name])
    rows = load(path)
    assert sorted(rows.train + rows.eval, key=lambda r: r["prompt"]) == sorted(PAIRS, key=lambda r: r["prompt"])


def cut(data: bytes) -> bytes:
    return data[: len(data) // 2]


UNREADABLE = {
    # name: (bytes, the format it was read as, where, what)
    "cut.jsonl.gz": (cut(gzip.compress(JSONL.encode())), "gzip-compressed data", "", "cannot decompress it"),
    "cut.jsonl.xz": (cut(lzma.compress(JSONL.encode())), "xz-compressed data", "", "cannot decompress it"),
    "cut.jsonl": (cut(JSONL.encode()), "JSON Lines", "line 11, column", "not a JSON object"),
    "cut.json": (cut(json.dumps(PAIRS).encode()), "JSON", "line 1, column", "not valid JSON"),
    "cut.parquet": (cut(parquet_bytes(PAIRS)), "Parquet", "", "ArrowInvalid"),
    "latin1.jsonl": (JSONL.replace("q3?", "q3\u00e9?").encode("latin-1"), "JSON Lines", "line 4", "not UTF-8 text"),
    "stray.jsonl": (JSONL.encode()[:100] + b"\x00" + JSONL.encode()[100:], "JSON Lines", "line 2", "not a JSON object"),
    "scalar.jsonl": (JSONL.encode() + b"[1, 2]\n", "JSON Lines", "line 21", "a JSON list, not an object"),
    "extra_cell.csv": (CSV.encode() + b"a,b,c,d\r\n", "CSV", "line 22", "4 cells, the header row has 3"),
    "open_quote.csv": (CSV.encode() + b'a,"b,c\r\n', "CSV", "line 22", "unexpected end of data"),
    "parquet_named.jsonl": (b"PAR1" + b"\x00" * 20, "Parquet", "", "ArrowInvalid"),
    "notes.txt": (b"hello\nworld\n", "text", "", "does not start like JSON"),
}


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_a_file_that_cannot_be_read_is_one_data_error_naming_file_format_place_and_formats(tmp_path, name):
    data, form, where, what = UNREADABLE[name]
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError) as caught:
        load(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"data.path: '{path}'{' ' + where if where else ''}"), message
    assert what in message and f"[read as {form}; accepted: {ACCEPTED_FORMATS}]" in message


def test_rows_that_are_no_pair_are_dropped_counted_per_reason_and_named_by_line(tmp_path):
    bad = [{"prompt": "x", "chosen": None, "rejected": "y"}, {"prompt": "x", "chosen": "same", "rejected": "same"},
           {"prompt": "x", "chosen": 5, "rejected": "y"}, {"prompt": "x", "rejected": "y"}]
    path = tmp_path / "prefs.jsonl"
    path.write_text(JSONL + "".join(json.dumps(r) + "\n" for r in bad))
    rows = load(path)
    assert len(rows.train) + len(rows.eval) == 20
    assert rows.dropped.rows == {"missing_value": ["line 21", "line 24"], "identical": ["line 22"],
                                 "not_text": ["line 23"]}
    assert "data: dropped 2 rows of " in rows.dropped.lines(rows.described)[0]


def test_parquet_rows_are_named_by_index_and_a_folder_by_file(tmp_path):
    (tmp_path / "train.parquet").write_bytes(parquet_bytes(PAIRS + [{"prompt": "x", "chosen": None, "rejected": "y"}]))
    (tmp_path / "test.csv").write_text(CSV + "x,same,same\r\n")
    rows = load(tmp_path, eval_split="test")
    assert rows.dropped.rows == {"missing_value": ["train.parquet row 20"], "identical": ["test.csv line 22"]}


def test_no_pair_left_is_a_data_error_with_the_counts(tmp_path):
    path = tmp_path / "prefs.csv"
    path.write_text("prompt,chosen,rejected\nq,a,a\nq,,b\nq,b,b\n")
    with pytest.raises(DataError, match=r"no row of .* is a preference pair; dropped: identical: 2, missing_value: 1"):
        load(path)


def test_hh_rows_without_a_shared_prompt_or_assistant_turn_are_dropped_by_line(tmp_path):
    rows = [{"chosen": f"\n\nHuman: q{i}\n\nAssistant: yes", "rejected": f"\n\nHuman: q{i}\n\nAssistant: no"}
            for i in range(10)]
    rows += [{"chosen": "\n\nHuman: a\n\nAssistant: x", "rejected": "\n\nHuman: b\n\nAssistant: y"},
             {"chosen": "no turn", "rejected": "\n\nHuman: b\n\nAssistant: y"}, {"chosen": None, "rejected": "z"}]
    path = tmp_path / "hh.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load(path, hh=True)
    assert loaded.dropped.rows == {"no_shared_prompt": ["line 11"], "no_assistant_turn": ["line 12"],
                                   "missing_value": ["line 13"]}
    assert loaded.counts["train_dropped_prompt_mismatch"] == 1


def test_a_hub_dataset_goes_through_the_reader_interface_with_a_files_error_shape(tmp_path, monkeypatch):
    """A data.path that is no local file goes to datasets.load_dataset (a hub name; here a folder of data
    files it finds from the working directory, as it would a hub repository's, no network): its splits'
    rows are named `<split> row N`, dropped rows too, and a failure reads as a file's does."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    hub = tmp_path / "cwd" / "org_prefs"
    hub.mkdir(parents=True)
    (hub / "train.jsonl").write_text(JSONL + json.dumps({"prompt": "q", "chosen": "same", "rejected": "same"}) + "\n")
    (hub / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PAIRS[:4]))
    monkeypatch.chdir(tmp_path / "cwd")
    elsewhere = tmp_path / "base"  # where the command ran: org_prefs is no local path there
    elsewhere.mkdir()
    cfg = OmegaConf.load(REPO / "conf" / "data" / "preference.yaml")
    cfg.path, cfg.eval_split = "org_prefs", "test"
    rows = load_preference_rows(cfg, elsewhere)
    assert (len(rows.train), len(rows.eval), rows.eval_source) == (20, 4, "test")
    assert rows.train_where[:2] == ["train row 0", "train row 1"] and rows.described == "hub dataset 'org_prefs'"
    assert rows.dropped.rows == {"identical": ["train row 20"]}

    (hub / "train.jsonl").write_text(JSONL + "{not json\n")
    with pytest.raises(DataError) as caught:
        load_preference_rows(cfg, elsewhere)
    message = str(caught.value)
    assert message.startswith("data.path: 'org_prefs': cannot load it (ArrowInvalid: JSON parse error"), message
    assert message.endswith("[read as a hub dataset (datasets.load_dataset); accepted: a local file "
                            f"({ACCEPTED_FORMATS}), a folder of them, or a hub dataset name]")
    assert "\n" not in message
