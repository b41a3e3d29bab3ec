"""The bad-input fuzzer (tests/support/fuzz.py) through the real CLI, a few examples: a corrupted data
file with a few settings completes, or exits 1 with one error line and no traceback; nothing written changes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import QUIET, REPO, cli_env
from support.fuzz import data_files


@pytest.mark.slow
@settings(max_examples=3, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data_files(), st.sampled_from([[], ["train.lr=0"], ["data.eval_size=1"], ["fsdp.hybrid_group_size=2"]]))
def test_the_cli_on_a_corrupted_file_completes_or_prints_one_error_line_and_changes_nothing(tmp_path_factory, file,
                                                                                          extra):
    folder = tmp_path_factory.mktemp("fuzz")
    data = folder / file[0]
    data.write_bytes(file[1])
    run_dir = folder / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("the user's own file\n")
    args = [sys.executable, "-m", "dpo_sweeps", *QUIET, "data=preference", f"data.path={data}", "train.max_steps=1",
            "train.eval_every=0", "train.batch_size=1", "train.micro_batch_size=1", *extra, f"hydra.run.dir={run_dir}"]
    result = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert (result.returncode, len(errors)) in ((0, 0), (1, 1)), output[-3000:]
    assert data.read_bytes() == file[1] and (run_dir / "notes.txt").read_text() == "the user's own file\n"
