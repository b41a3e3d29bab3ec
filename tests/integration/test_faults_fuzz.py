"""The bad-input fuzzer (tests/support/fuzz.py) through the real CLI, a few examples: a corrupted data
file under a random override set, and random override sets the checks accept, each run for one step:
it completes, or exits 1 with one error line and no traceback; nothing written changes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from support.fuzz import OVERRIDE_SETS, check_overrides, data_files, run_overrides

pytestmark = pytest.mark.slow
# Three CLI runs in all: one corrupted file, two accepted override sets (bench/fuzz_inputs.py runs many).
FEW = settings(max_examples=2, deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                      HealthCheck.filter_too_much])


@settings(FEW, max_examples=1)
@given(data_files(), OVERRIDE_SETS)
def test_the_cli_on_a_corrupted_file_completes_or_prints_one_error_line_and_changes_nothing(tmp_path_factory, file,
                                                                                          overrides):
    folder = tmp_path_factory.mktemp("fuzz")
    data = folder / file[0]
    data.write_bytes(file[1])
    run_overrides(["data=preference", f"data.path={data}", "train.batch_size=1", "train.micro_batch_size=1",
                   *overrides], folder)
    assert data.read_bytes() == file[1]


@FEW
@given(OVERRIDE_SETS)
def test_an_override_set_the_checks_accept_runs_to_completion_or_one_error_line(tmp_path_factory, overrides):
    assume(check_overrides(overrides) == "accepted")  # refused ones never start; too big ones are the bench's
    run_overrides(overrides, tmp_path_factory.mktemp("fuzz"))
