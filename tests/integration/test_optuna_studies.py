"""Optuna studies beyond one sweep process: shared by several workers, constrained by memory, written by
an older Optuna."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, cli_env
from support.dashboard import dashboard_trials
from support.sweeps import FAST, run_sweep

from dpo_sweeps.train.study_storage import MEMORY_CONSTRAINT, open_storage

optuna = pytest.importorskip("optuna")

# Micro-batches of 1 to 64 pairs at data.max_length 1024 (prefix-shared rows of 1,536 tokens): the estimated
# peak grows from about 0.48 GiB to 3.4 GiB; 0.8 GiB lets 1, 2 and 4 (0.62 GiB) fit and not 16 (1.2 GiB), 32 or 64.
MEMORY_BOUND = ["model=tiny_llama", "resources.nproc_per_node=1", "train.batch_size=64", "train.max_steps=1",
                "data.max_length=1024", "data.max_prompt_length=512", "resources.device_memory_gib=0.8",
                "train.micro_batch_size=choice(1, 2, 4, 16, 32, 64)", "hydra.sweeper.n_trials=10",
                "hydra.sweeper.sampler.seed=0", "hydra.sweeper.sampler.n_startup_trials=2"]
FITS = {1, 2, 4}


@pytest.mark.slow
def test_points_predicted_out_of_memory_teach_the_sampler_to_stay_inside_the_memory(tmp_path):
    sweep_dir = tmp_path / "study"
    result = run_sweep(sweep_dir, "hydra/sweeper=optuna", *MEMORY_BOUND)
    assert result.returncode == 0, result.output[-3000:]
    study = optuna.load_study(study_name="dpo_sweeps", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    trials = study.trials
    sizes = [t.params["train.micro_batch_size"] for t in trials]
    skipped = [t for t in trials if t.params["train.micro_batch_size"] not in FITS]
    assert skipped, sizes  # the random start tried points that do not fit
    for trial in trials:
        summary = result.summary(trial.number)
        over = trial.user_attrs[MEMORY_CONSTRAINT]
        assert (over > 0) == (trial in skipped)
        assert summary["status"] == ("skipped" if over > 0 else "completed")
    # Told to the study as infeasible, not as failures the sampler would ignore.
    assert all(t.state.name == "COMPLETE" for t in trials)
    if hasattr(trials[0], "constraints"):  # Optuna 5: the constraint as the study holds it
        assert all(list(t.constraints.values()) == [t.user_attrs[MEMORY_CONSTRAINT]] for t in trials)
    assert study.best_trial.params["train.micro_batch_size"] in FITS
    # Once TPE has seen each size that does not fit, it stays inside the memory.
    assert all(size in FITS for size in sizes[-4:]), sizes


def sweep_process(sweep_dir: Path, *overrides: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *FAST, *overrides, f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.Popen(args, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output[-3000:]
    return output


@pytest.mark.slow
def test_two_sweep_processes_share_one_journal_study_and_a_third_is_pruned_against_both(tmp_path):
    sweep_dir = tmp_path / "study"
    journal = sweep_dir / "optuna.journal"
    shared = ["hydra/sweeper=optuna", "resources.nproc_per_node=1", "train.max_steps=10", "train.eval_every=5",
              f"hydra.sweeper.storage=journal:{journal}", "hydra.sweeper.pruner=median",
              # No pruning before 4 trials completed: the two workers' trials all complete.
              "hydra.sweeper.pruner_settings={n_startup_trials: 4, n_warmup_steps: 0}", "hydra.sweeper.sampler.seed=0",
              "loss.beta=interval(0.05, 0.5)"]
    workers = [sweep_process(sweep_dir, *shared, "hydra.sweeper.n_trials=2", "train.lr=tag(log, interval(1e-3, 1e-2))")
               for _ in range(2)]
    for worker in workers:
        finish(worker)
    storage = open_storage(f"journal:{journal}")
    trials = optuna.load_study(study_name="dpo_sweeps", storage=storage).trials
    # The sum of their n_trials, each trial run once, in its own run directory.
    assert [(t.number, t.state.name) for t in trials] == [(n, "COMPLETE") for n in range(4)]
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 4
    for trial in trials:
        summary = run_summary(sweep_dir, trial.number)
        assert summary["status"] == "completed"
        assert summary["config"]["train"]["lr"] == pytest.approx(trial.params["train.lr"])
        assert list(trial.intermediate_values) == [5]

    # A third worker's hopeless trial (updates that vanish in fp32 rounding) is judged by the others' values.
    third = finish(sweep_process(sweep_dir, *shared, "hydra.sweeper.n_trials=1",
                                 "train.lr=tag(log, interval(1e-12, 1e-2))",
                                 "hydra.sweeper.enqueue_trials=[{train.lr: 1e-12}]"))
    assert "pruned     1" in third
    last = optuna.load_study(study_name="dpo_sweeps", storage=storage).trials[4]
    assert last.state.name == "PRUNED" and list(last.intermediate_values) == [5]
    summary = run_summary(sweep_dir, 4)
    assert summary["status"] == "pruned" and "median pruner stopped trial 4 at step 5 of 10" in summary["failure"]["message"]

    # The report reads the journal study (hydra.sweeper.storage in the sweep's multirun.yaml).
    from dpo_sweeps.analysis.optuna_study import load_studies

    (study,) = load_studies([sweep_dir], [])
    assert [t.state for t in study.trials] == ["COMPLETE"] * 4 + ["PRUNED"]

    # optuna-dashboard opens the journal study too.
    shown = dashboard_trials(storage, "dpo_sweeps")
    assert [(t["number"], t["state"]) for t in shown] == [(n, "Complete") for n in range(4)] + [(4, "Pruned")]
    assert {v["step"] for t in shown for v in t["intermediate_values"]} == {5}


def run_summary(sweep_dir: Path, num: int) -> dict:
    import json

    return json.loads((sweep_dir / str(num) / "summary.json").read_text())


def test_a_study_written_by_optuna_2_10_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    sweep_dir = tmp_path / "study"
    sweep_dir.mkdir()
    db = sweep_dir / "optuna.db"
    with sqlite3.connect(db) as connection:  # optuna 2.10.1's schema and one trial (a dump of what it wrote)
        connection.executescript((REPO / "tests" / "support" / "optuna_2_10_study.sql").read_text())
    before = db.read_bytes()
    result = run_sweep(sweep_dir, "hydra/sweeper=optuna", "loss.beta=interval(0.05, 0.5)", timeout=120)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "optuna storage upgrade" in line]
    assert len(lines) == 1 and "one-way" in lines[0] and lines[0].startswith("error: hydra.sweeper.storage:"), result.stderr
    assert db.read_bytes() == before and not (sweep_dir / "0").exists()

    from dpo_sweeps.analysis.optuna_study import load_studies

    (study,) = load_studies([sweep_dir], [])
    assert "optuna storage upgrade" in study.problem and "one-way" in study.problem
