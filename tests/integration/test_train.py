"""One config trained end to end through the real CLI: `python -m dpo_sweeps [overrides]`."""

import json
import math

import pytest
from support import run_cli

FEW_STEPS = ["train.max_steps=8", "train.eval_every=0"]
SHORT = [*FEW_STEPS, "data.num_train_pairs=512", "data.num_eval_pairs=64"]  # synthetic data only


@pytest.mark.slow
def test_default_run_learns_the_synthetic_task(tmp_path):
    """No overrides at all (wandb offline, progress bar on): held-out preference accuracy >= 0.9."""
    result = run_cli(tmp_path / "run", quiet=False, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = result.summary
    assert summary["status"] == "completed" and summary["failure"] is None
    assert summary["metrics"]["eval/rewards/accuracies"] >= 0.9
    assert summary["metrics"]["steps"] == 120
    assert "dpo:" in result.stderr and "120/120" in result.stderr  # the progress bar
    losses = result.train_losses()
    assert len(losses) == 120 and losses[-1] < 0.5 * losses[0]
    assert (tmp_path / "run" / "model" / "config.json").exists()


def test_summary_and_metrics_follow_the_interface(tmp_path):
    result = run_cli(tmp_path / "run", *SHORT, "fsdp=shard_grad_op", "loss.beta=0.2")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = result.summary
    assert summary["schema"] == 1
    assert set(summary["overrides"]) >= {"fsdp=shard_grad_op", "loss.beta=0.2"}
    assert summary["config"]["loss"]["beta"] == 0.2 and summary["config"]["fsdp"]["sharding_strategy"] == "shard_grad_op"
    assert len(summary["config_hash"]) == 16
    for key in ("eval/rewards/accuracies", "eval/rewards/margins", "eval/loss", "train/loss", "perf/tokens_per_s",
                "perf/tokens_per_s_per_device", "perf/examples_per_s", "perf/peak_memory_gib",
                "perf/speed_per_memory", "perf/step_time_s", "perf/mfu", "steps", "world_size"):
        assert key in summary["metrics"], key
    m = summary["metrics"]
    assert m["perf/speed_per_memory"] == pytest.approx(m["perf/tokens_per_s_per_device"] / m["perf/peak_memory_gib"])
    train = [r for r in result.records if "train/loss" in r]
    evals = [r for r in result.records if "eval/loss" in r]
    assert [r["step"] for r in train] == list(range(1, 9))
    for prefix, rows in (("train", train), ("eval", evals)):
        for name in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                     "logps/chosen", "logps/rejected", "loss"):
            assert f"{prefix}/{name}" in rows[-1]
    assert {"train/grad_norm", "train/lr"} <= set(train[-1])
    assert evals[-1]["eval/loss"] == m["eval/loss"]
    # Linear warmup over train.warmup_steps (10): the lr of step 1 is lr / 11.
    assert train[0]["train/lr"] == pytest.approx(summary["config"]["train"]["lr"] / 11)


@pytest.mark.parametrize("loss,beta,expected", [("dpo", 0.1, math.log(2)), ("ipo", 0.1, 25.0), ("ipo", 0.5, 1.0)])
def test_step_zero_loss_on_synthetic_data(tmp_path, loss, beta, expected):
    result = run_cli(tmp_path / "run", *SHORT, "train.max_steps=1", f"loss={loss}", f"loss.beta={beta}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.train_losses()[0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("loss,expected", [("dpo", math.log(2)), ("ipo", 25.0)])
def test_step_zero_loss_on_hh_data(tmp_path, hh_path, loss, expected):
    result = run_cli(tmp_path / "run", "data=hh", f"data.path={hh_path}", "data.max_length=128",
                     "data.max_prompt_length=64", "train.batch_size=8", "train.micro_batch_size=4",
                     "train.max_steps=1", "train.eval_max_pairs=8", f"loss={loss}", "loss.beta=0.1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.train_losses()[0] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_trains_on_real_hh_data_and_evaluates_held_out_pairs(tmp_path, hh_path):
    result = run_cli(tmp_path / "run", "data=hh", f"data.path={hh_path}", "data.max_length=192",
                     "data.max_prompt_length=96", "train.batch_size=16", "train.micro_batch_size=8",
                     "train.max_steps=12", "train.eval_every=6", "train.eval_max_pairs=64", "train.lr=1e-3")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = result.summary
    assert summary["data"]["train_dropped_prompt_mismatch"] == 5
    assert summary["data"]["eval_pairs"] == 64 and summary["data"]["train_truncated"] > 0
    assert summary["data"]["dropped_rows"]["no_shared_prompt"] == 5
    assert "data: dropped 5 rows of" in result.stdout + result.stderr  # with the first rows' line numbers
    evals = [r for r in result.records if "eval/loss" in r]
    assert [r["step"] for r in evals] == [6, 12]
    assert 0.0 <= summary["metrics"]["eval/rewards/accuracies"] <= 1.0
    losses = result.train_losses()
    assert losses[0] == pytest.approx(math.log(2), rel=1e-6) and min(losses[-3:]) < losses[0]


@pytest.mark.slow
def test_the_same_seed_gives_the_same_losses(tmp_path):
    a = run_cli(tmp_path / "a", *SHORT, "train.seed=3")
    b = run_cli(tmp_path / "b", *SHORT, "train.seed=3")
    c = run_cli(tmp_path / "c", *SHORT, "train.seed=4")
    assert a.returncode == b.returncode == c.returncode == 0, a.stderr[-1000:]
    assert a.train_losses() == b.train_losses()
    assert a.train_losses() != c.train_losses()
    assert a.summary["config_hash"] == b.summary["config_hash"] != c.summary["config_hash"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny_llama", "tiny_gpt_neox"])
def test_other_architecture_presets_train(tmp_path, preset):
    result = run_cli(tmp_path / "run", *SHORT, f"model={preset}", "train.save_model=true")
    assert result.returncode == 0, result.stderr[-2000:]
    losses = result.train_losses()
    assert losses[0] == pytest.approx(math.log(2), rel=1e-6) and losses[-1] < losses[0]
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()


@pytest.mark.slow
def test_rmsprop_and_gradient_accumulation(tmp_path):
    result = run_cli(tmp_path / "run", *SHORT, "train.optimizer=rmsprop", "train.lr=1e-3",
                     "train.batch_size=16", "train.micro_batch_size=2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.train_losses()[-1] < result.train_losses()[0]


@pytest.mark.slow
def test_sft_then_dpo_from_the_sft_model(tmp_path):
    sft = run_cli(tmp_path / "sft", *SHORT, "loss=sft", "train.save_model=true", "train.max_steps=15")
    assert sft.returncode == 0, sft.stderr[-2000:]
    sft_losses = sft.train_losses()
    assert sft_losses[-1] < sft_losses[0]  # chosen-response NLL falls
    assert (tmp_path / "sft" / "model" / "tokenizer.json").exists()

    dpo = run_cli(tmp_path / "dpo", *SHORT, f"model.init_from={tmp_path / 'sft'}")
    fresh = run_cli(tmp_path / "fresh", *SHORT)
    assert dpo.returncode == 0 and fresh.returncode == 0, dpo.stderr[-2000:]
    first, first_fresh = dpo.records[0], fresh.records[0]
    # The SFT model is both the start and the reference: loss ln 2, and it already prefers chosen text.
    assert first["train/loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert first["train/logps/chosen"] > first_fresh["train/logps/chosen"]


BAD_INPUTS = [
    (["loss.beta=0"], "invalid_config", "loss.beta: got 0"),
    (["loss.beta=-0.1"], "invalid_config", "loss.beta"),
    (["train.batch_size=30", "train.micro_batch_size=8"], "invalid_config",
     "train.batch_size: 30 is not a multiple of train.micro_batch_size (8) x ranks (1)"),
    (["train.batch_size=8", "train.micro_batch_size=4", "resources.nproc_per_node=3"], "invalid_config",
     "train.batch_size: 8 is not a multiple of train.micro_batch_size (4) x ranks (3)"),
    (["data.max_prompt_length=64", "data.max_length=64"], "invalid_config", "data.max_prompt_length"),
    (["data=hh", "data.path=./no/such/file.jsonl"], "data_error", "data.path: no such file or folder"),
    (["model=gpt2", "model.name_or_path=no-such-org/no-such-model"], "invalid_config", "model.name_or_path: cannot load"),
    (["model.block_name=Block"], "invalid_config", "model.block_name: GPT2LMHeadModel has no module of class 'Block' (accepted: GPT2Block)"),
    (["fsdp=hybrid_shard", "resources.nproc_per_node=3", "fsdp.hybrid_group_size=2", "train.batch_size=24"],
     "invalid_config", "fsdp.hybrid_group_size: 2 does not divide the 3 ranks"),
    (["precision.param_dtype=float8"], "invalid_config", "precision.param_dtype: unknown dtype 'float8'"),
]


@pytest.mark.parametrize("overrides,kind,message", BAD_INPUTS, ids=[b[2].split(":")[0] + "-" + str(i) for i, b in enumerate(BAD_INPUTS)])
def test_bad_input_is_refused_before_training_with_one_line(tmp_path, overrides, kind, message):
    result = run_cli(tmp_path / "run", *FEW_STEPS, *overrides, timeout=120)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    summary = result.summary
    assert summary["status"] == "failed" and summary["failure"]["kind"] == kind
    assert message in summary["failure"]["message"]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing trained


@pytest.mark.slow
def test_missing_column_and_empty_data_are_data_errors(tmp_path):
    bad_columns = tmp_path / "cols.jsonl"
    bad_columns.write_text("".join(json.dumps({"prompt": "p", "chosen": "a", "worse": "b"}) + "\n" for _ in range(10)))
    result = run_cli(tmp_path / "cols", *FEW_STEPS, "data=preference", f"data.path={bad_columns}", "data.eval_size=2")
    assert result.returncode == 1 and result.summary["failure"]["kind"] == "data_error"
    assert "data.rejected_column: column 'rejected'" in result.summary["failure"]["message"]

    mismatched = tmp_path / "hh.jsonl"
    mismatched.write_text("".join(
        json.dumps({"chosen": f"\n\nHuman: {i}\n\nAssistant: a", "rejected": f"\n\nHuman: x{i}\n\nAssistant: b"}) + "\n"
        for i in range(10)))
    result = run_cli(tmp_path / "empty", *FEW_STEPS, "data=hh", f"data.path={mismatched}", "data.eval_size=2")
    assert result.returncode == 1 and result.summary["failure"]["kind"] in ("data_error", "invalid_config")
    assert "data." in result.summary["failure"]["message"]
