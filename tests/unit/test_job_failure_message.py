"""The failure message of a job that ended without rank 0's summary.json (launchers/collect.py): what the
job's stderr says, never submitit's own framing of it."""

from __future__ import annotations

from types import SimpleNamespace

from submitit.core.utils import UncompletedJobError

from dpo_sweeps.launchers.collect import _failure_message

SUBMITTED = SimpleNamespace(paths=SimpleNamespace(folder="/runs/.submitit/216"))


def submitit_error(state: str, stderr: str) -> UncompletedJobError:
    """An error worded as submitit's Job.result() words a job without a result (submitit/core/core.py)."""
    lines = ["Job 216 (task: 0) with path /runs/.submitit/216/216_0_result.pkl",
             f"has not produced any output (state: {state})"]
    if stderr:
        lines += ["Error stream produced:", "-" * 40, stderr]
    return UncompletedJobError("\n".join(lines))


def test_a_stderr_without_a_cause_adds_no_detail_to_the_state():
    warning = "[W1204 11:00:39.548380332 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3"
    message = _failure_message(None, "NODE_FAIL", submitit_error("NODE_FAIL", warning), SUBMITTED)
    assert message == ("job ended without rank 0 writing summary.json (state NODE_FAIL); "
                       "logs: /runs/.submitit/216"), message


def test_the_last_error_line_of_the_stderr_is_the_detail():
    stderr = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: CUDA error: device-side assert"
    message = _failure_message(None, "FAILED", submitit_error("FAILED", stderr), SUBMITTED)
    assert message.endswith("(state FAILED): RuntimeError: CUDA error: device-side assert; logs: /runs/.submitit/216")


def test_an_error_of_another_kind_gives_its_first_line():
    message = _failure_message(None, "", OSError("cannot reach the scheduler\nretrying"), SUBMITTED)
    assert message.endswith("(state UNKNOWN): cannot reach the scheduler; logs: /runs/.submitit/216"), message
