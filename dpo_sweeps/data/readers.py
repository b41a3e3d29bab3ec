"""Reading preference data, whatever its format or place, under one set of rules.

Every format is a `Reader`: it turns a file's bytes (already decompressed and, for text formats,
decoded) into records, each with where it sits in the file (`line N` for text, `row N` otherwise).
`read_table` is the way in for a file: it opens, decompresses and decodes the file, picks the reader,
and turns every failure on the way into one DataError naming the file, the format it was read as, the
line or row, and the formats accepted. A hub dataset is read by `read_hub` through the same interface
(`HubDataset`: `datasets.load_dataset`'s splits, `<split> row N`) and the same error wrapper. A new
format is a new Reader in READERS, and cannot skip these rules. What common readers accept is accepted: gzip / bz2 / xz compression (found by its
magic bytes, whatever the suffix says), UTF-8 with or without a byte-order mark, UTF-16 with one,
CRLF line endings, a `.json` file that holds JSON Lines (as `datasets` writes them).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpo_sweeps.errors import DataError

ACCEPTED_FORMATS = ("JSON Lines (.jsonl), JSON (.json: a list of objects), Parquet (.parquet), CSV (.csv) or TSV "
                    "(.tsv) with a header row, each optionally compressed (.gz, .bz2, .xz)")
DATA_SOURCES = f"a local file ({ACCEPTED_FORMATS}), a folder of them, or a hub dataset name"

# Compression, by the file's first bytes: (name, magic, decompress).
COMPRESSIONS = (
    ("gzip", b"\x1f\x8b", gzip.decompress),
    ("bz2", b"BZh", bz2.decompress),
    ("xz", b"\xfd7zXZ\x00", lzma.decompress),
)
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")
PARQUET_MAGIC = b"PAR1"
# Text encodings recognised by their byte-order mark; anything else is read as UTF-8.
BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


class RowProblem(Exception):
    """Raised by a reader: the record at `where` cannot be read."""

    def __init__(self, where: str, problem: str):
        super().__init__(problem)
        self.where, self.problem = where, problem


@dataclass
class Table:
    """A file's records, each with where it is in the file."""

    records: list[Any]
    where: list[str]  # per record: "line N" (text formats) or "row N" (from 0, binary formats)
    format: str


class Reader:
    """One format. `text`: it reads decoded text (else the decompressed bytes)."""

    name = ""
    suffixes: tuple[str, ...] = ()
    text = True

    def records(self, data: Any) -> Iterator[tuple[str, Any]]:
        raise NotImplementedError


def _json_error(exc: json.JSONDecodeError, line_offset: int = 0) -> RowProblem:
    return RowProblem(f"line {exc.lineno + line_offset}, column {exc.colno}", f"not valid JSON ({exc.msg})")


class JsonLines(Reader):
    name, suffixes = "JSON Lines", (".jsonl", ".ndjson")

    def records(self, text: str) -> Iterator[tuple[str, Any]]:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RowProblem(f"line {number}, column {exc.colno}", f"not a JSON object ({exc.msg})") from None
            yield f"line {number}", record


class Json(Reader):
    name, suffixes = "JSON", (".json",)

    def records(self, text: str) -> Iterator[tuple[str, Any]]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg == "Extra data" and text.lstrip().startswith("{"):  # JSON Lines in a .json file
                yield from JsonLines().records(text)
                return
            raise _json_error(exc) from None
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise RowProblem("line 1", f"a JSON {type(data).__name__}, not a list of rows (or {{\"data\": [rows]}})")
        for index, record in enumerate(data):
            yield f"row {index}", record


class Delimited(Reader):
    """CSV or TSV with a header row: each record maps the header's names to the row's cells, as a
    Parquet table's rows do. An empty cell is null, as pandas reads it; so are the cells a short row lacks."""

    def __init__(self, name: str, suffixes: tuple[str, ...], delimiter: str):
        self.name, self.suffixes, self.delimiter = name, suffixes, delimiter

    def records(self, text: str) -> Iterator[tuple[str, Any]]:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=self.delimiter, strict=True)
        try:
            header = next(reader, None)
            if header is None:
                return
            if len(set(header)) != len(header) or not all(h.strip() for h in header):
                raise RowProblem("line 1", f"the header row {header} has an empty or repeated column name")
            start = reader.line_num + 1
            for cells in reader:
                where, start = f"line {start}", reader.line_num + 1
                if not any(c.strip() for c in cells):
                    continue
                if len(cells) > len(header):
                    raise RowProblem(where, f"{len(cells)} cells, the header row has {len(header)}")
                yield where, dict(zip(header, [c if c != "" else None for c in cells] + [None] * (len(header) - len(cells))))
        except csv.Error as exc:
            raise RowProblem(f"line {reader.line_num}", str(exc)) from None


class Parquet(Reader):
    name, suffixes, text = "Parquet", (".parquet",), False

    def records(self, data: bytes) -> Iterator[tuple[str, Any]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(pa.BufferReader(data)).to_pylist()
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise RowProblem("", _first_line(exc)) from None
        for index, record in enumerate(rows):
            yield f"row {index}", record


READERS: tuple[Reader, ...] = (JsonLines(), Json(), Parquet(), Delimited("CSV", (".csv",), ","),
                               Delimited("TSV", (".tsv", ".tab"), "\t"))
LOCAL_SUFFIXES = tuple(s + c for r in READERS for s in r.suffixes for c in ("",) + COMPRESSED_SUFFIXES)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def reader_for(path: Path, head: bytes) -> Reader | None:
    """The reader by the file's suffix (compression suffixes aside); Parquet's magic bytes win; None: unknown."""
    if head.startswith(PARQUET_MAGIC):
        return READERS[2]
    name = path.name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    for reader in READERS:
        if name.endswith(reader.suffixes):
            return reader
    return None


def _sniff(text: str) -> Reader | None:
    """A file whose suffix names no format: JSON when its text starts like JSON."""
    start = text.lstrip()[:1]
    return READERS[1] if start in ("[", "{") else None


def _decode(data: bytes) -> str:
    """Text from bytes: the encoding a byte-order mark names, else UTF-8; CRLF and CR become LF."""
    encoding = next((enc for bom, enc in BOMS if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RowProblem(f"line {line}", f"not {encoding.upper().removesuffix('-SIG')} text "
                         f"(byte {data[exc.start:exc.start + 1]!r} at offset {exc.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


class Failure:
    """The one shape of every reading failure: `data.path: '<source>' <where>: <problem> [read as <format>;
    accepted: <what>]`."""

    def __init__(self, source: str, form: str, accepted: str = ACCEPTED_FORMATS):
        self.source, self.form, self.accepted = source, form, accepted

    def __call__(self, problem: str, where: str = "") -> DataError:
        at = f" {where}" if where else ""
        return DataError(f"data.path: '{self.source}'{at}: {problem} [read as {self.form}; accepted: {self.accepted}]")


def _collect(reader: Reader, content: Any, fail: Failure) -> Table:
    """The reader's records of `content`, each an object of columns, or one DataError (`fail`)."""
    fail.form = reader.name
    records, where = [], []
    try:
        for place, record in reader.records(content):
            where.append(place)
            records.append(record)
    except RowProblem as exc:
        raise fail(exc.problem, exc.where) from None
    except (RecursionError, MemoryError) as exc:
        raise fail(_first_line(exc)) from None
    for place, record in zip(where, records):
        if not isinstance(record, dict):
            raise fail(f"a JSON {type(record).__name__}, not an object of columns", place)
    return Table(records, where, reader.name)


def read_table(path: Path) -> Table:
    """Every record of the data file at `path`, or one DataError saying what stopped the reading."""
    fail = Failure(str(path), "a data file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise fail(f"cannot open it ({exc.strerror or _first_line(exc)})") from None
    for compression, magic, decompress in COMPRESSIONS:
        if data.startswith(magic):
            try:
                data = decompress(data)
            except (EOFError, OSError, ValueError, zlib.error, lzma.LZMAError) as exc:
                fail.form = f"{compression}-compressed data"
                raise fail(f"cannot decompress it, the file may be cut short ({_first_line(exc)})") from None
            break
    reader = reader_for(path, data[:4])
    fail.form = reader.name if reader is not None else "text"
    try:
        content = _decode(data) if reader is None or reader.text else data
        if reader is None:
            reader = _sniff(content)
            if reader is None:
                raise RowProblem("", "its name has no suffix of a format read here and its text does not start "
                                 "like JSON")
    except RowProblem as exc:
        raise fail(exc.problem, exc.where) from None
    return _collect(reader, content, fail)


class HubDataset(Reader):
    """One split of a dataset as `datasets.load_dataset` loads it (a hub name; also a local folder of data
    files or a loading script it reads): its rows, `<split> row N` (from 0)."""

    name, text = "a hub dataset (datasets.load_dataset)", False

    def __init__(self, split: str = "train"):
        self.split = split

    def records(self, rows: Any) -> Iterator[tuple[str, Any]]:
        index = 0
        try:  # rows come from its files as they are read
            for index, record in enumerate(rows):
                yield f"{self.split} row {index}", record
        except Exception as exc:
            raise RowProblem(f"{self.split} row {index}", _root_cause(exc)) from None


def read_hub(name: str, data_dir: str | None = None) -> dict[str, Table]:
    """Every split's records of the dataset `datasets.load_dataset(name, data_dir=...)` loads, or one
    DataError of read_table's shape (the source, the format, the split and row, what is accepted)."""
    fail = Failure(name, HubDataset.name, DATA_SOURCES)
    try:
        loaded = _load_dataset(name, data_dir)
    except Exception as exc:  # the hub client and the dataset builders raise many types
        raise fail(f"cannot load it ({_root_cause(exc)})") from None
    return {split: _collect(HubDataset(split), rows, fail) for split, rows in loaded.items()}


def _load_dataset(name: str, data_dir: str | None) -> Any:
    """datasets.load_dataset, without the library's own error log (the DataError says it, once)."""
    import logging

    import datasets

    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        return datasets.load_dataset(name, data_dir=data_dir)
    finally:
        logger.setLevel(level)


def _root_cause(exc: BaseException) -> str:
    """The first line of the exception `exc` was raised from, innermost (datasets wraps a parse error in a
    generic one)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return _first_line(exc)
