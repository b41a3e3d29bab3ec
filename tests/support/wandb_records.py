"""Read the records of an offline wandb run file (`run-*.wandb`), to check what a run logged.

The file is a 7-byte header (":W&B", a 2-byte magic, a version byte) followed by a LevelDB-style
log: 32 KiB blocks of chunks, each `crc32 (4) | length (2, little-endian) | type (1) | data`, where
type 1 is a whole record and 2/3/4 are the first/middle/last pieces of one. Each record is a
`wandb_internal_pb2.Record` protobuf.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7


def read_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # block trailer padding
            pos += room
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def run_config_and_history(path: Path) -> tuple[dict, list[dict], str]:
    """(config, history rows, group) of the run in a .wandb file."""
    config, history, group = {}, [], ""
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            group = record.run.run_group
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
    return config, history, group


def run_group_and_job_type(path: Path) -> tuple[str, str]:
    """(group, job type) of the run in a .wandb file."""
    for record in read_records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run.run_group, record.run.job_type
    raise AssertionError(f"{path} has no run record")
