"""Optuna search: `python -m dpo_sweeps -m hydra/sweeper=optuna +sweep=optuna_dpo ...`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_helpers import run_sweep  # noqa: E402

from launchers.optuna_sweeper import ObjectiveUnavailable, objective_values  # noqa: E402

optuna = pytest.importorskip("optuna")

# The preset's search space (beta, lr, batch size), with 1-rank trials of 4 steps.
SMALL_TRIALS = ["hydra/sweeper=optuna", "+sweep=optuna_dpo", "resources.nproc_per_node=1", "train.max_steps=4"]


def load_study(sweep_dir: Path):
    return optuna.load_study(study_name="dpo_sweeps", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")


def test_a_study_of_six_trials_run_as_two_invocations_of_three(tmp_path):
    sweep_dir = tmp_path / "study"
    first = run_sweep(sweep_dir, *SMALL_TRIALS, "hydra.sweeper.n_trials=3")
    assert first.returncode == 0, first.output[-3000:]
    assert len(load_study(sweep_dir).trials) == 3

    second = run_sweep(sweep_dir, *SMALL_TRIALS, "hydra.sweeper.n_trials=3")
    assert second.returncode == 0, second.output[-3000:]
    trials = load_study(sweep_dir).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6
    # Trial i ran in run directory i: the second invocation did not overwrite the first's runs.
    assert [p.name for p in second.run_dirs()] == [str(i) for i in range(6)]
    for trial in trials:
        summary = second.summary(trial.number)
        assert summary["status"] == "completed"
        assert trial.value == summary["metrics"]["eval/rewards/accuracies"]
        assert summary["config"]["loss"]["beta"] == pytest.approx(trial.params["loss.beta"])
        assert summary["config"]["train"]["batch_size"] == trial.params["train.batch_size"]
    assert (sweep_dir / "optimization_results.yaml").exists()


def test_invalid_trials_are_not_run_and_fail_in_the_study(tmp_path):
    """Batch size 24 is not a multiple of micro batch 16: every trial is refused before launch."""
    sweep_dir = tmp_path / "study"
    result = run_sweep(sweep_dir, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2",
                       "train.micro_batch_size=16", "train.batch_size=choice(24)", "loss.beta=interval(0.05, 0.5)")
    assert result.returncode != 0
    assert [t.state.name for t in load_study(sweep_dir).trials] == ["FAIL", "FAIL"]
    for n in range(2):
        failure = result.summary(n)["failure"]
        assert failure["kind"] == "invalid_config" and failure["message"].startswith("train.batch_size: 24")
    assert "failed     2  (invalid_config: 2)" in result.stdout
    assert not list(sweep_dir.glob(".submitit/*/*_submitted.pkl"))  # nothing was launched


def test_objectives_are_read_from_the_run_metrics():
    metrics = {"eval/rewards/accuracies": 0.75, "perf/speed_per_memory": 1200.0, "perf/mfu": None}
    assert objective_values(metrics, ["eval/rewards/accuracies"]) == 0.75
    assert objective_values(metrics, ["eval/rewards/accuracies", "perf/speed_per_memory"]) == [0.75, 1200.0]
    with pytest.raises(ObjectiveUnavailable, match="'perf/mfu' is None"):
        objective_values(metrics, ["perf/mfu"])
