"""Write realistic sweep directories (INTERFACE.md's run directory contract) for report tests.

    python tests/support/reports.py /tmp/sample-sweep      # a grid sweep to try the report on

The numbers follow a simple made-up model of DPO on FSDP: bf16 and lighter sharding are
faster, sharding and bf16 save memory, a smaller beta reaches a higher preference
accuracy; each seed adds a little noise.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

TRAIN_STEPS = 30
EVAL_EVERY = 10

SHARDING_MEMORY = {"full_shard": 0.55, "shard_grad_op": 0.75, "hybrid_shard": 0.65, "no_shard": 1.0}
SHARDING_SPEED = {"full_shard": 1.0, "shard_grad_op": 1.1, "hybrid_shard": 1.05, "no_shard": 1.18}
PRECISION_MEMORY = {"fp32": 1.0, "bf16": 0.62, "fp16": 0.62}
PRECISION_SPEED = {"fp32": 1.0, "bf16": 1.7, "fp16": 1.65}


def resolved_config(sharding: str, precision: str, beta: float, batch_size: int, seed: int) -> dict[str, Any]:
    """A resolved config shaped like conf/config.yaml's, trimmed to what the report reads."""
    return {
        "model": {"name_or_path": "tiny_gpt2", "block_name": "GPT2Block"},
        "data": {"name": "synthetic", "seed": 0},
        "loss": {"name": "dpo", "beta": beta},
        "fsdp": {"sharding_strategy": sharding, "reshard_after_forward": sharding != "shard_grad_op"},
        "precision": {"name": precision},
        "train": {"batch_size": batch_size, "micro_batch_size": 8, "max_steps": TRAIN_STEPS, "lr": 3e-3,
                  "seed": seed},
        "resources": {"nodes": 1, "nproc_per_node": 2},
        "wandb": {"mode": "offline", "project": "dpo-sweeps", "group": "fixture"},
    }


def simulated_metrics(sharding: str, precision: str, beta: float, batch_size: int, seed: int) -> dict[str, Any]:
    """summary.json metrics for a completed run of this config and seed."""
    noise = random.Random(f"{sharding}/{precision}/{beta}/{batch_size}/{seed}")
    tokens_per_device = 9000 * SHARDING_SPEED[sharding] * PRECISION_SPEED[precision] * (batch_size / 32) ** 0.3
    tokens_per_device *= 1 + noise.gauss(0, 0.03)
    peak_memory = (2.0 + 0.05 * batch_size) * SHARDING_MEMORY[sharding] * PRECISION_MEMORY[precision]
    peak_memory *= 1 + noise.gauss(0, 0.01)
    accuracy = min(0.99, 0.93 - 0.25 * beta + noise.gauss(0, 0.015))
    step_time = batch_size * 64 / (tokens_per_device * 2)
    return {
        "eval/rewards/accuracies": round(accuracy, 4),
        "eval/rewards/margins": round(2.5 * accuracy - 1.1, 4),
        "eval/loss": round(0.693 - 0.5 * (accuracy - 0.5), 4),
        "train/loss": round(0.693 - 0.55 * (accuracy - 0.5), 4),
        "perf/tokens_per_s": round(2 * tokens_per_device, 2),
        "perf/tokens_per_s_per_device": round(tokens_per_device, 2),
        "perf/examples_per_s": round(2 * tokens_per_device / 64, 3),
        "perf/peak_memory_gib": round(peak_memory, 4),
        "perf/speed_per_memory": round(tokens_per_device / peak_memory, 3),
        "perf/step_time_s": round(step_time, 4),
        "perf/mfu": None,
        "steps": TRAIN_STEPS,
        "world_size": 2,
    }


def training_log(metrics: dict[str, Any], steps: int, seed: int) -> list[dict[str, Any]]:
    """metrics.jsonl records that end at the summary's final values."""
    noise = random.Random(seed)
    accuracy = metrics.get("eval/rewards/accuracies") or 0.6
    records = []
    for step in range(1, steps + 1):
        progress = 1 - math.exp(-4 * step / TRAIN_STEPS)
        train_accuracy = 0.5 + (accuracy - 0.5) * progress + noise.gauss(0, 0.04)
        records.append({
            "step": step,
            "train/loss": round(0.693 - 0.55 * (accuracy - 0.5) * progress + noise.gauss(0, 0.02), 4),
            "train/rewards/chosen": round(0.3 * progress, 4),
            "train/rewards/rejected": round(-0.4 * progress, 4),
            "train/rewards/accuracies": round(min(1.0, max(0.0, train_accuracy)), 4),
            "train/rewards/margins": round(0.7 * progress, 4),
            "train/logps/chosen": round(-80 + 5 * progress, 3),
            "train/logps/rejected": round(-80 - 7 * progress, 3),
            "train/grad_norm": round(2.0 - progress + abs(noise.gauss(0, 0.2)), 4),
            "train/lr": 3e-3 * min(1.0, step / 10),
            "perf/step_time_s": metrics.get("perf/step_time_s") or 0.2,
        })
        if step % EVAL_EVERY == 0:
            final = step == TRAIN_STEPS
            eval_accuracy = accuracy if final else 0.5 + (accuracy - 0.5) * progress
            records.append({
                "step": step,
                "eval/loss": metrics["eval/loss"] if final else round(0.693 - 0.5 * (eval_accuracy - 0.5), 4),
                "eval/rewards/accuracies": round(eval_accuracy, 4),
                "eval/rewards/margins": round(2.5 * eval_accuracy - 1.1, 4),
            })
    return records


def write_run(run_dir: Path, job: int, overrides: list[str], config: dict[str, Any], *,
              status: str | None, metrics: dict[str, Any] | None = None,
              failure: dict[str, str] | None = None, log: list[dict[str, Any]] = (),
              half_written_line: bool = False) -> Path:
    """One run directory; `status=None` leaves out summary.json (a run still going)."""
    hydra_dir = run_dir / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    (hydra_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (hydra_dir / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (hydra_dir / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {
        "mode": "MULTIRUN", "job": {"name": "__main__", "num": job, "override_dirname": ",".join(overrides)},
        "runtime": {"output_dir": str(run_dir.resolve())}}}))
    text = "".join(json.dumps(record) + "\n" for record in log)
    if half_written_line:
        text += '{"step": 7, "train/loss": 0.6'
    (run_dir / "metrics.jsonl").write_text(text)
    if status is not None:
        summary = {
            "schema": 1,
            "status": status,
            "failure": failure,
            "overrides": overrides,
            "config_hash": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16],
            "config": config,
            "metrics": metrics,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir


def _overrides(sharding: str, precision: str, beta: float, batch_size: int, seed: int | None) -> list[str]:
    overrides = [f"fsdp={sharding}", f"precision={precision}", f"loss.beta={beta}", f"train.batch_size={batch_size}"]
    return overrides + ([f"train.seed={seed}"] if seed is not None else [])


def write_completed(run_dir: Path, job: int, sharding: str, precision: str, beta: float, batch_size: int = 32,
                    seed: int = 0, seed_override: bool = False) -> dict[str, Any]:
    """A completed run of the simulated config; returns its summary metrics."""
    metrics = simulated_metrics(sharding, precision, beta, batch_size, seed)
    config = resolved_config(sharding, precision, beta, batch_size, seed)
    overrides = _overrides(sharding, precision, beta, batch_size, seed if seed_override else None)
    write_run(run_dir, job, overrides, config, status="completed", metrics=metrics,
              log=training_log(metrics, TRAIN_STEPS, seed))
    return metrics


def write_oom(run_dir: Path, job: int, sharding: str, precision: str, beta: float, batch_size: int) -> None:
    """A run that ran out of device memory at its first step."""
    metrics = {name: None for name in simulated_metrics(sharding, precision, beta, batch_size, 0)}
    metrics.update(steps=0, world_size=2)
    write_run(run_dir, job, _overrides(sharding, precision, beta, batch_size, None),
              resolved_config(sharding, precision, beta, batch_size, 0), status="failed", metrics=metrics,
              failure={"kind": "oom", "message": "CUDA out of memory. Tried to allocate 3.00 GiB"})


def write_pending(run_dir: Path, job: int, sharding: str, precision: str, beta: float, batch_size: int) -> None:
    """A run still going: no summary.json, a few log lines and a half-written last one."""
    metrics = simulated_metrics(sharding, precision, beta, batch_size, 0)
    write_run(run_dir, job, _overrides(sharding, precision, beta, batch_size, None),
              resolved_config(sharding, precision, beta, batch_size, 0), status=None,
              log=training_log(metrics, 6, 0), half_written_line=True)


def grid_sweep(sweep_dir: Path) -> Path:
    """A Hydra multirun dir: fsdp x precision x beta, one config with two seeds, an OOM, a pending run.

    Jobs 0-7 are the grid at batch 32 (job 0 is seed 0 of the two-seed config, job 8 its
    seed 1), job 9 is no_shard fp32 at batch 128 (OOM), job 10 is still running.
    """
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"mode": "MULTIRUN", "sweep": {
        "dir": str(sweep_dir)}}, "train": {"max_steps": TRAIN_STEPS}}))
    job = 0
    for sharding in ("full_shard", "shard_grad_op"):
        for precision in ("fp32", "bf16"):
            for beta in (0.1, 0.5):
                write_completed(sweep_dir / str(job), job, sharding, precision, beta)
                job += 1
    write_completed(sweep_dir / "8", 8, "full_shard", "fp32", 0.1, seed=1, seed_override=True)
    write_oom(sweep_dir / "9", 9, "no_shard", "fp32", 0.1, 128)
    write_pending(sweep_dir / "10", 10, "no_shard", "bf16", 0.1, 32)
    return sweep_dir


def probe_sweep(sweep_dir: Path) -> Path:
    """A probe sweep (probe.steps=10): fsdp x precision, speed and memory only, no accuracy."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    job = 0
    for sharding in ("full_shard", "shard_grad_op"):
        for precision in ("fp32", "bf16"):
            full = simulated_metrics(sharding, precision, 0.1, 32, 0)
            metrics = {"probe/steps": 10, **{k: v for k, v in full.items() if k.startswith("perf/")},
                       "steps": 10, "world_size": 2}
            log = [{k: v for k, v in r.items() if not k.startswith("eval/")}
                   for r in training_log(full, 10, 0) if "train/loss" in r]
            write_run(sweep_dir / str(job), job, [f"fsdp={sharding}", f"precision={precision}", "probe.steps=10"],
                      resolved_config(sharding, precision, 0.1, 32, 0), status="completed", metrics=metrics, log=log)
            job += 1
    return sweep_dir


def optuna_sweep(sweep_dir: Path, study_name: str = "dpo-pareto") -> Path:
    """An Optuna sweep (two objectives: speed per memory, preference accuracy) with its study.

    Trials 0-4 completed, trial 5 failed with an OOM, 2 of the 8 trials planned are still to
    come; the study lives in `optuna.db` and the sweeper's `optimization_results.yaml` lists
    the Pareto solutions.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"mode": "MULTIRUN", "sweeper": {
        "_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
        "direction": ["maximize", "maximize"], "study_name": study_name, "n_trials": 8,
        "storage": f"sqlite:///{sweep_dir}/optuna.db"}}}))
    study = optuna.create_study(study_name=study_name, storage=f"sqlite:///{sweep_dir}/optuna.db",
                                directions=["maximize", "maximize"])
    distributions = {"fsdp": optuna.distributions.CategoricalDistribution(["full_shard", "shard_grad_op", "no_shard"]),
                     "loss.beta": optuna.distributions.UniformDistribution(0.05, 0.6)}
    trials = [("full_shard", 0.1), ("shard_grad_op", 0.3), ("full_shard", 0.45), ("shard_grad_op", 0.08),
              ("no_shard", 0.2), ("no_shard", 0.55)]
    for number, (sharding, beta) in enumerate(trials):
        params = {"fsdp": sharding, "loss.beta": beta}
        if sharding == "no_shard" and beta > 0.5:
            write_oom(sweep_dir / str(number), number, sharding, "bf16", beta, 128)
            state, values = optuna.trial.TrialState.FAIL, None
        else:
            metrics = write_completed(sweep_dir / str(number), number, sharding, "bf16", beta)
            state = optuna.trial.TrialState.COMPLETE
            values = [metrics["perf/speed_per_memory"], metrics["eval/rewards/accuracies"]]
        with warnings.catch_warnings():  # add_trial and create_trial are "experimental" in optuna 2
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.add_trial(optuna.trial.create_trial(state=state, values=values, params=params,
                                                      distributions=distributions))
    solutions = [{"params": t.params, "values": list(t.values)} for t in study.best_trials]
    (sweep_dir / "optimization_results.yaml").write_text(yaml.safe_dump({"name": "optuna", "solutions": solutions}))
    return sweep_dir


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/support/reports.py OUT_DIR   (writes a sample grid sweep there)")
    print(grid_sweep(Path(sys.argv[1])))
