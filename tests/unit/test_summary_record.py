"""summary.json as one typed record (dpo_sweeps/rundir/summary.py): what each writer's file holds, files
of earlier versions read back, and the one rule for which attempt wrote a summary."""

from __future__ import annotations

import json

import pytest

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.rundir.summary import (
    Status,
    Summary,
    SummaryUnreadable,
    load_summary,
    read_summary,
    rewrite_summary,
    write_summary,
)

CONFIG = {"train": {"max_steps": 4}, "wandb": {"api_key": "secret-value-123"}}


def on_disk(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_a_rank_summary_has_the_interface_keys_and_reads_back_equal(tmp_path):
    written = write_summary(tmp_path, Summary(
        Status.FAILED, Failure(FailureKind.OOM, "rank 1: out of memory", rank=1, step=3, cause="out of memory"),
        ["train.max_steps=4"], CONFIG, {"steps": 3}, attempt="a1", wall_s=2.5, device_seconds=5.0,
        device_kind="cpu", plan={"label": "FULL_SHARD fp32"}))
    record = on_disk(tmp_path)
    assert list(record)[:7] == ["schema", "status", "failure", "overrides", "config_hash", "config", "metrics"]
    assert record["failure"] == {"kind": "oom", "message": "rank 1: out of memory", "rank": 1, "step": 3,
                                 "cause": "out of memory"}
    assert record["config"]["wandb"]["api_key"] == "<redacted>" and len(record["config_hash"]) == 16
    assert record["metrics"]["eval/rewards/accuracies"] is None and record["metrics"]["steps"] == 3
    assert record["resumed_from_step"] is None  # a rank that built its trainer says whether it resumed
    assert "written_by" not in record and "layout" not in record  # unset keys are not written
    assert read_summary(tmp_path) == written == load_summary(tmp_path)


def test_a_point_never_started_has_kind_and_message_only(tmp_path):
    write_summary(tmp_path, Summary(Status.SKIPPED, Failure(FailureKind.OOM_PREDICTED, "estimate > limit",
                                                            started=False), [], CONFIG, {},
                                    written_by="sweeper: fit check", wall_s=0.0, device_seconds=0.0))
    record = on_disk(tmp_path)
    assert record["failure"] == {"kind": "oom_predicted", "message": "estimate > limit"}
    assert {"written_by", "wall_s", "device_seconds"} <= set(record) and "attempt" not in record
    assert "resumed_from_step" not in record and "device_kind" not in record


def test_an_older_file_reads_and_keeps_its_keys_when_rewritten(tmp_path):
    older = {"schema": 1, "status": "failed", "failure": {"kind": "crash", "message": "peer went away"},
             "overrides": [], "config_hash": "0123456789abcdef", "config": CONFIG, "metrics": {"steps": 1},
             "attempt": "old", "a_key_of_a_newer_writer": [1, 2]}
    (tmp_path / "summary.json").write_text(json.dumps(older))
    summary = read_summary(tmp_path)
    assert summary.failure == Failure(FailureKind.CRASH, "peer went away", started=False)
    rewrite_summary(tmp_path, summary, failure=Failure(FailureKind.NODE_FAILURE, "node lost", rank=2))
    record = on_disk(tmp_path)
    assert record["a_key_of_a_newer_writer"] == [1, 2] and record["attempt"] == "old"
    assert record["config_hash"] == "0123456789abcdef"  # as the run wrote it
    assert record["failure"]["kind"] == "node_failure" and record["failure"]["cause"] == "node lost"


def test_a_summary_is_an_attempts_only_when_it_carries_that_attempts_id(tmp_path):
    assert read_summary(tmp_path, attempt="a1") is None  # none yet
    write_summary(tmp_path, Summary(Status.COMPLETED, None, [], CONFIG, {}, attempt="a0"))
    assert read_summary(tmp_path) is not None and read_summary(tmp_path, attempt="a1") is None  # an earlier one
    write_summary(tmp_path, Summary(Status.COMPLETED, None, [], CONFIG, {}, attempt="a1"))
    assert read_summary(tmp_path, attempt="a1").attempt == "a1"


@pytest.mark.parametrize(("text", "reason"), [
    ('{"schema": 1, "status": "compl', "summary.json is not valid JSON"),
    ('{"schema": 2, "status": "completed"}', "summary.json schema is 2"),
    ('{"schema": 1, "status": "running"}', "summary.json status is 'running'"),
    ('{"schema": 1, "status": "failed", "failure": null}', "summary.json says failed but has no failure"),
])
def test_a_file_that_is_not_a_summary_is_unreadable_in_one_line(tmp_path, text, reason):
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(SummaryUnreadable, match=reason) as caught:
        load_summary(tmp_path)
    assert "\n" not in str(caught.value)
    assert read_summary(tmp_path) is None
