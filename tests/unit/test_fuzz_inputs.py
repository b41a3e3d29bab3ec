"""A fuzzer of bad input (tests/support/fuzz.py): data files with random corruptions and random override
sets each end read / accepted, or refused in one line; never another exception, nothing written changed.
Bounded and derandomized here (the CLI itself: tests/integration/test_faults_fuzz.py);
bench/fuzz_inputs.py runs many more."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from support.fuzz import OVERRIDE_SETS, check_data_file, check_overrides, data_files

CI = settings(max_examples=50, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@CI
@given(data_files())
def test_a_corrupted_data_file_is_read_or_refused_in_one_line(file):
    with tempfile.TemporaryDirectory() as folder:
        check_data_file(Path(folder), *file)


@CI
@given(OVERRIDE_SETS)
def test_a_random_override_set_is_accepted_or_refused_in_one_line(overrides):
    check_overrides(overrides)
