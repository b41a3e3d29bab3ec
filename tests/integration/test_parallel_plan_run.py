"""The parallel plan a real two-rank run records in summary.json (tests/unit/test_parallel_plan.py has the
plan's resolution from composed configs)."""

from __future__ import annotations

import json
import subprocess
import sys

from support import QUIET, REPO, cli_env

from dpo_sweeps.config.schema import Config
from dpo_sweeps.parallel.plan import resolve_plan


def test_a_two_rank_run_records_the_plan_it_trained_with(tmp_path):
    """fsdp=full_shard fsdp.reshard_after_forward=false: the summary's plan and memory estimate are
    those of fsdp=shard_grad_op (the same tiny run's estimate is a pure function of its shape)."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dpo_sweeps", *QUIET, "fsdp=full_shard", "fsdp.reshard_after_forward=false",
            "resources.nproc_per_node=2", "resources.device=cpu", "train.max_steps=2", "train.batch_size=4",
            "train.micro_batch_size=2", "train.eval_every=0", "train.eval_max_pairs=4", "checkpoint.every_steps=0",
            f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    plan = summary["plan"]
    assert plan["label"] == "SHARD_GRAD_OP fp32" and plan["strategy"] == "SHARD_GRAD_OP"
    assert plan["mesh"] == summary["layout"]["mesh"] == {"shard": 2}
    assert plan["reshard_after_forward"] is False and plan["sharding_strategy"] == "full_shard"
    config = summary["config"]
    shard_grad_op = resolve_plan(Config.of({**config, "fsdp": {**config["fsdp"], "sharding_strategy": "shard_grad_op"}}))
    assert {k: v for k, v in plan.items() if k != "sharding_strategy"} == \
           {k: v for k, v in shard_grad_op.as_dict().items() if k != "sharding_strategy"}
    assert summary["metrics"]["perf/peak_memory_estimate_gib"] > 0
