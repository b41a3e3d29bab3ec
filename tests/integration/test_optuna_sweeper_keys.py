"""`hydra/sweeper=optuna` takes hydra-optuna-sweeper's keys: its documented configs run as they are written."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import yaml
from support import REPO
from support.sweeps import run_sweep

optuna = pytest.importorskip("optuna")

# 1-rank trials of 2 steps on the small synthetic data.
TINY = ["resources.nproc_per_node=1", "train.max_steps=2"]


def preset(tmp_path: Path, name: str, body: str) -> list[str]:
    """A `+sweep=<name>` preset in a config dir of its own; the overrides that use it."""
    folder = tmp_path / "conf" / "sweep"
    folder.mkdir(parents=True)
    (folder / f"{name}.yaml").write_text("# @package _global_\n" + textwrap.dedent(body))
    return [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "hydra/sweeper=optuna", f"+sweep={name}"]


@pytest.mark.slow
def test_the_plugins_custom_search_space_example_runs_unchanged(tmp_path):
    # Its example/custom-search-space/config.yaml, on this project's keys: storage null (in memory),
    # max_failure_rate 0.0, and a define-by-run function that adds a key of its own (`+w`).
    args = preset(tmp_path, "plugin_example", """
        hydra:
          sweeper:
            sampler:
              seed: 123
            direction: minimize
            study_name: custom-search-space
            storage: null
            n_trials: 2
            n_jobs: 1
            max_failure_rate: 0.0
            objectives: [eval/loss]
            params:
              train.lr: tag(log, interval(1e-3, 1e-2))
            custom_search_space: support.optuna_examples.configure
        """)
    env = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    result = run_sweep(tmp_path / "study", *args, *TINY, env=env)
    assert result.returncode == 0, result.output[-3000:]
    results = yaml.safe_load((tmp_path / "study" / "optimization_results.yaml").read_text())
    assert set(results["best_params"]) == {"train.lr", "loss.beta", "+train.tag_seed"}
    losses = []
    for n in range(2):
        summary = result.summary(n)
        assert summary["status"] == "completed"
        lr, beta = summary["config"]["train"]["lr"], summary["config"]["loss"]["beta"]
        assert 1e-3 <= lr <= 1e-2 and 10 * lr <= beta <= 100 * lr  # the custom function's bounds
        assert summary["config"]["train"]["tag_seed"] in range(4)
        losses.append(summary["metrics"]["eval/loss"])
    assert results["best_value"] == min(losses)  # direction: minimize


@pytest.mark.slow
def test_the_pareto_command_of_optuna_dpo_composes_and_runs(tmp_path):
    """The command at the top of conf/sweep/optuna_dpo.yaml (NSGA-II, two objectives), with tiny trials."""
    result = run_sweep(tmp_path / "pareto", "hydra/sweeper=optuna", "+sweep=optuna_dpo",
                       "hydra.sweeper.objectives=[eval/rewards/accuracies,perf/speed_per_memory]",
                       "hydra.sweeper.direction=[maximize,maximize]", "hydra/sweeper/sampler=nsgaii",
                       "hydra.sweeper.n_trials=2", *TINY)
    assert result.returncode == 0, result.output[-3000:]
    study = optuna.load_study(study_name="dpo_sweeps", storage=f"sqlite:///{tmp_path / 'pareto' / 'optuna.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    for trial in study.trials:
        metrics = result.summary(trial.number)["metrics"]
        assert trial.values == [metrics["eval/rewards/accuracies"], metrics["perf/speed_per_memory"]]
    solutions = yaml.safe_load((tmp_path / "pareto" / "optimization_results.yaml").read_text())["solutions"]
    assert solutions and all(len(s["values"]) == 2 for s in solutions)


@pytest.mark.slow
def test_a_grid_study_ends_after_its_last_point_with_exit_0_and_its_results(tmp_path):
    # The plugin's tests/conf/test_grid.yaml shape: n_trials above the grid's size; the grid decides.
    args = preset(tmp_path, "plugin_grid", """
        defaults:
          - override /hydra/sweeper/sampler: grid
        hydra:
          sweeper:
            direction: maximize
            study_name: sphere
            n_trials: 20
            n_jobs: 2
            params:
              loss.beta: choice(0.1, 0.2)
              train.max_steps: range(2, 3, step=1)
        """)
    result = run_sweep(tmp_path / "grid", *args, "resources.nproc_per_node=1")
    assert result.returncode == 0, result.output[-3000:]
    study = optuna.load_study(study_name="sphere", storage=f"sqlite:///{tmp_path / 'grid' / 'optuna.db'}")
    assert sorted(t.params["loss.beta"] for t in study.trials) == [0.1, 0.2]  # each point once, then it stopped
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    results = yaml.safe_load((tmp_path / "grid" / "optimization_results.yaml").read_text())
    assert results["best_value"] == study.best_value and results["best_params"] == study.best_params


def test_a_setting_the_sampler_does_not_have_is_refused_naming_it(tmp_path):
    result = run_sweep(tmp_path / "study", "hydra/sweeper=optuna", "hydra/sweeper/sampler=random",
                       "+hydra.sweeper.sampler.n_startup_trials=3", "loss.beta=interval(0.05, 0.5)", timeout=120)
    assert result.returncode != 0
    assert "hydra.sweeper.sampler.n_startup_trials: not a setting of RandomSampler (accepted: seed)" in result.output
    assert not (tmp_path / "study" / "0").exists()
