"""Two processes writing one file at once (two sweeps sharing one study folder both write its
multirun.yaml): each write lands whole, neither fails, no temporary file is left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WRITER = """
import sys
from dpo_sweeps.rundir.atomic import write_text_atomic
path, text = sys.argv[1], sys.argv[2] * 2000
for _ in range(400):
    write_text_atomic(path, text)
"""


def test_two_processes_writing_one_file_at_once_both_succeed(tmp_path: Path):
    target = tmp_path / "multirun.yaml"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(target), letter], stderr=subprocess.PIPE, text=True)
               for letter in "ab"]
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    assert target.read_text() in ("a" * 2000, "b" * 2000)
    assert [p.name for p in tmp_path.iterdir()] == ["multirun.yaml"]
