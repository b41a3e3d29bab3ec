"""What `python -m dpo_sweeps` tells the user when a single run ends: one line, the failure once or where
the results are, and no third-party warning the user can do nothing about."""

from __future__ import annotations

import json

from support import run_cli

BROKEN_JSON = '{"prompt": "p", "chosen": "a", "rejected": "b"}\n{"prompt": broken\n'
NO_REJECTED = '{"prompt": "p", "chosen": "a"}\n'


def test_a_data_error_is_printed_once_as_the_error_line(tmp_path):
    data = tmp_path / "prefs.jsonl"
    data.write_text(BROKEN_JSON)
    result = run_cli(tmp_path / "run", "data=preference", f"data.path={data}", "train.max_steps=2")
    assert result.returncode == 1
    said = f"data.path: '{data}' line 2, column 12: not a JSON object"
    assert (result.stdout + result.stderr).count(said) == 1, result.stdout + result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"error: run failed (data_error): {said}")
    assert said in (tmp_path / "run" / "task.log").read_text()  # the rank's own record stays in the run's log


def test_a_data_error_of_two_local_ranks_is_printed_once(tmp_path):
    data = tmp_path / "prefs.jsonl"
    data.write_text(NO_REJECTED)
    result = run_cli(tmp_path / "run", "data=preference", f"data.path={data}", "resources.nproc_per_node=2",
                     "train.batch_size=16", "train.max_steps=2")
    assert result.returncode == 1
    said = f"data.rejected_column: column 'rejected' not in '{data}'"
    assert (result.stdout + result.stderr).count(said) == 1, result.stdout + result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"error: run failed (data_error): {said}")


def test_a_completed_lora_run_ends_with_its_directory_and_metrics_and_no_library_warning(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(run_dir, "model=tiny_llama", "peft=lora", "resources.nproc_per_node=2", "train.max_steps=2",
                     "train.eval_every=0", "data.num_train_pairs=32", "data.num_eval_pairs=8", "train.batch_size=4",
                     "train.micro_batch_size=2")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((run_dir / "summary.json").read_text())["metrics"]
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"run completed: {run_dir} (2 steps in "), last
    assert f"eval/rewards/accuracies {metrics['eval/rewards/accuracies']:.3g}" in last
    assert "perf/tokens_per_s " in last and "perf/peak_memory_gib " in last
    # peft reads transformers' deprecated is_gradient_checkpointing on each rank: not the user's to fix.
    assert "is_gradient_checkpointing" not in result.stdout + result.stderr
    assert "FutureWarning" not in result.stdout + result.stderr
