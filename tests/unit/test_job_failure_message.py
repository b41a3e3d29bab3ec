"""The failure message of a job that ended without rank 0's summary.json (launchers/collect.py): what the
job's stderr says, never submitit's own framing of it; for a job SLURM ended NODE_FAIL, the node lost, as
the ranks' heartbeats tell it (launchers/forensics.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from submitit.core.utils import UncompletedJobError

from dpo_sweeps.errors import FailureKind
from dpo_sweeps.launchers.collect import _failure_message
from dpo_sweeps.launchers.forensics import lost_node_report
from dpo_sweeps.runtime.watchdog import heartbeat_dir

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


def write_beats(run_dir, beats: dict[int, tuple[str, float, int]]) -> None:
    """Heartbeats as the ranks' watchdogs leave them (INTERFACE.md): rank -> (host, time, step)."""
    folder = heartbeat_dir(run_dir)
    folder.mkdir(parents=True)
    for rank, (host, at, step) in beats.items():
        (folder / f"rank{rank}.json").write_text(json.dumps({
            "rank": rank, "pid": 100 + rank, "host": host, "alive": 9, "progress": 3 * step, "step": step,
            "phase": "backward", "armed": True, "time": at}))


@pytest.mark.parametrize("lost, first_rank", [("dpo-n1", 0), ("dpo-n2", 2)])
def test_the_node_whose_ranks_stopped_first_is_named_lost_with_its_first_rank(tmp_path, lost, first_rank):
    """SLURM killed the survivors in their collective, 40 s after the node went: nobody wrote why."""
    hosts = {0: "dpo-n1", 1: "dpo-n1", 2: "dpo-n2", 3: "dpo-n2"}
    write_beats(tmp_path, {r: (h, 1000.0 + (0 if h == lost else 40) + r / 10, 7) for r, h in hosts.items()})
    found = lost_node_report(tmp_path)
    assert found is not None and found.reported_by is None
    assert (found.failure.kind, found.failure.rank, found.failure.step) == (FailureKind.NODE_FAILURE, first_rank, 7)
    assert found.failure.message.startswith(f"rank {first_rank} lost with its node {lost} (ranks {first_rank}, "
                                            f"{first_rank + 1} there)"), found.failure.message
    assert "stopped 40 s before the other nodes' ranks, the last at step 7 (backward)" in found.failure.message
    message = _failure_message(found, "NODE_FAIL", None, SUBMITTED)
    assert message.startswith(found.failure.message) and "(state NODE_FAIL)" in message


@pytest.mark.parametrize("beats", [
    {0: ("dpo-n1", 1000.0, 7), 1: ("dpo-n1", 1000.2, 7), 2: ("dpo-n2", 1004.0, 7), 3: ("dpo-n2", 1004.1, 7)},
    {0: ("dpo-n1", 1000.0, 7), 1: ("dpo-n1", 1000.2, 7)},  # one node
    {0: ("dpo-n1", 1000.0, 7), 1: ("dpo-n1", 1060.0, 9), 2: ("dpo-n2", 1061.0, 9)},  # a rank of each went on
], ids=["all-stopped-together", "one-node", "not-a-whole-node-first"])
def test_heartbeats_that_do_not_tell_a_lost_node_name_none(tmp_path, beats):
    write_beats(tmp_path, beats)
    assert lost_node_report(tmp_path) is None
