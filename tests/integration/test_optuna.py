"""Optuna search: `python -m dpo_sweeps -m hydra/sweeper=optuna +sweep=optuna_dpo ...`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import REPO  # noqa: E402
from support.dashboard import dashboard_trials  # noqa: E402
from support.mlflow_server import params_of, tags_of  # noqa: E402
from support.sweeps import run_sweep  # noqa: E402

from dpo_sweeps.launchers.optuna_sweeper import ObjectiveUnavailable, objective_values  # noqa: E402

optuna = pytest.importorskip("optuna")

# The preset's search space (beta, lr, batch size), with 1-rank trials of 4 steps.
SMALL_TRIALS = ["hydra/sweeper=optuna", "+sweep=optuna_dpo", "resources.nproc_per_node=1", "train.max_steps=4"]


def load_study(sweep_dir: Path):
    return optuna.load_study(study_name="dpo_sweeps", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")


@pytest.mark.slow
def test_a_study_of_six_trials_run_as_two_invocations_of_three(tmp_path, mlflow_server):
    sweep_dir = tmp_path / "study"
    # Logged to a real MLflow server too: one parent run for the study, each trial's run tagged with its number.
    tracked = [*SMALL_TRIALS, "tracking.backends=[mlflow]", f"tracking.mlflow.tracking_uri={mlflow_server.uri}",
               "tracking.mlflow.experiment_name=optuna_study"]
    first = run_sweep(sweep_dir, *tracked, "hydra.sweeper.n_trials=3")
    assert first.returncode == 0, first.output[-3000:]
    assert len(load_study(sweep_dir).trials) == 3

    second = run_sweep(sweep_dir, *tracked, "hydra.sweeper.n_trials=3")
    assert second.returncode == 0, second.output[-3000:]
    trials = load_study(sweep_dir).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6
    # The sampler's fixed seed (0, the preset's) did not replay the first invocation's draws.
    drawn = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(drawn)) == 6, drawn
    # Trial i ran in run directory i: the second invocation did not overwrite the first's runs.
    assert [p.name for p in second.run_dirs()] == [str(i) for i in range(6)]
    for trial in trials:
        summary = second.summary(trial.number)
        assert summary["status"] == "completed"
        assert trial.value == summary["metrics"]["eval/rewards/accuracies"]
        assert summary["config"]["loss"]["beta"] == pytest.approx(trial.params["loss.beta"])
        assert summary["config"]["train"]["batch_size"] == trial.params["train.batch_size"]
    assert (sweep_dir / "optimization_results.yaml").exists()

    # In MLflow (read through its REST API): both invocations' trials nested under the study's one parent
    # run, each tagged `trial` with its Optuna trial number, its parameters the trial's.
    runs = mlflow_server.runs("optuna_study")
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in tags_of(r)]
    nested = [r for r in runs if tags_of(r).get("mlflow.parentRunId") == parent["info"]["run_id"]]
    assert len(runs) == 7 and tags_of(parent)["dpo_sweeps.sweep"] == "study"
    by_trial = {int(tags_of(r)["dpo_sweeps.trial"]): r for r in nested}
    assert sorted(by_trial) == [t.number for t in trials] == list(range(6))
    for trial in trials:
        run = by_trial[trial.number]
        assert tags_of(run)["dpo_sweeps.stage"] == "trial" and tags_of(run)["mlflow.runName"] == f"study/{trial.number}"
        assert float(params_of(run)["loss.beta"]) == pytest.approx(trial.params["loss.beta"])
        assert params_of(run)["train.batch_size"] == str(trial.params["train.batch_size"])
        assert run["info"]["status"] == "FINISHED"


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


# 1-rank trials on the grid sweeper's small synthetic data (sweep_helpers.FAST), evaluated every 5 steps.
PRUNED_STUDY = ["hydra/sweeper=optuna", "resources.nproc_per_node=1", "train.max_steps=20", "train.eval_every=5",
                "hydra.sweeper.n_trials=3", "hydra.sweeper.pruner=median",
                "hydra.sweeper.pruner_settings={n_startup_trials: 2, n_warmup_steps: 0}",
                "train.lr=tag(log, interval(1e-12, 1e-2))",
                # Two trials that learn, then one whose updates vanish in fp32 rounding: its policy stays the
                # reference, so its accuracy stays about 0 (a pair or so above by rounding).
                "hydra.sweeper.enqueue_trials=[{train.lr: 0.003}, {train.lr: 0.003}, {train.lr: 1e-12}]"]


@pytest.mark.slow
def test_the_median_pruner_stops_a_trial_whose_learning_rate_cannot_learn(tmp_path):
    sweep_dir = tmp_path / "study"
    result = run_sweep(sweep_dir, *PRUNED_STUDY)
    assert result.returncode == 0, result.output[-3000:]  # a pruned trial is a result, not a failure
    trials = load_study(sweep_dir).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    # Every evaluation before the last was reported as an intermediate value; the pruned one stopped at its first.
    assert sorted(trials[0].intermediate_values) == [5, 10, 15]
    assert list(trials[2].intermediate_values) == [5] and trials[2].intermediate_values[5] < 0.05
    assert trials[0].intermediate_values[5] > 0.3

    # optuna-dashboard opens the study the sweep wrote, and shows what Optuna holds.
    shown = dashboard_trials(f"sqlite:///{sweep_dir / 'optuna.db'}", "dpo_sweeps")
    assert [(t["number"], t["state"]) for t in shown] == [(0, "Complete"), (1, "Complete"), (2, "Pruned")]
    for seen, trial in zip(shown, trials):
        assert {p["name"]: p["param_internal_value"] for p in seen["params"]} == trial.params
        assert seen["values"] == [trial.value]
        assert {v["step"]: v["value"] for v in seen["intermediate_values"]} == trial.intermediate_values

    summary = result.summary(2)
    assert summary["status"] == "pruned" and summary["failure"]["kind"] == "pruned"
    assert "median pruner stopped trial 2 at step 5 of 20" in summary["failure"]["message"]
    assert summary["metrics"]["steps"] == 5
    records = [json.loads(line) for line in (sweep_dir / "2" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 5
    assert "pruned     1" in result.stdout
    assert "by pruning device-seconds (estimated)" in result.stdout

    report = subprocess.run([sys.executable, "analysis/report.py", str(sweep_dir)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "1 pruned" in report.stdout
    runs_csv = (sweep_dir / "report" / "runs.csv").read_text()
    assert runs_csv.count(",pruned,") == 1
    # The dashboard shows the curves the pruner judged.
    assert (sweep_dir / "report" / "optuna-0-intermediate.png").stat().st_size > 0
    html = (sweep_dir / "report" / "report.html").read_text()
    assert 'alt="Optuna intermediate values"' in html
    # Optuna's own figures, embedded in the page (it stands alone).
    for name, alt in (("history", "Optuna optimization history"), ("importances", "Optuna parameter importances")):
        assert (sweep_dir / "report" / f"optuna-0-{name}.png").stat().st_size > 0
        assert f'<img alt="{alt}" src="data:image/png;base64,' in html


@pytest.mark.slow
def test_a_free_slot_gets_the_next_trial_without_waiting_for_the_slowest(tmp_path):
    """n_jobs=2: a long trial and a short one start together; the third starts when the short one ends."""
    sweep_dir = tmp_path / "study"
    result = run_sweep(sweep_dir, "hydra/sweeper=optuna", "resources.nproc_per_node=1", "hydra.sweeper.n_trials=3",
                       "hydra.sweeper.n_jobs=2", "train.max_steps=choice(2, 150)",
                       "hydra.sweeper.enqueue_trials=[{train.max_steps: 150}, {train.max_steps: 2}, "
                       "{train.max_steps: 2}]")
    assert result.returncode == 0, result.output[-3000:]
    runs = {r["num"]: r for r in json.loads((sweep_dir / "slots.json").read_text())["runs"]}
    long, short, next_one = runs[0], runs[1], runs[2]
    assert short["ended"] <= next_one["started"] < long["ended"]
    assert [t.state.name for t in load_study(sweep_dir).trials] == ["COMPLETE"] * 3


@pytest.mark.parametrize("overrides, message", [
    (["hydra.sweeper.pruner=median", "hydra.sweeper.objectives=[eval/rewards/accuracies,perf/speed_per_memory]",
      "hydra.sweeper.direction=[maximize,maximize]"],
     "hydra.sweeper.pruner: median with 2 objectives (Optuna cannot prune multi-objective trials)"),
    (["hydra.sweeper.pruner=patient"], "hydra.sweeper.pruner: unknown pruner 'patient' (accepted: none, median,"),
    (["hydra.sweeper.pruner=median", "hydra.sweeper.pruner_settings={patience: 3}"],
     "hydra.sweeper.pruner_settings: patience is not a setting of median (accepted: n_startup_trials,"),
])
def test_pruner_settings_that_cannot_work_are_refused_before_any_trial(tmp_path, overrides, message):
    sweep_dir = tmp_path / "study"
    result = run_sweep(sweep_dir, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "loss.beta=interval(0.05, 0.5)",
                       *overrides, timeout=120)
    assert result.returncode != 0
    assert message in result.output, result.output[-2000:]
    assert not (sweep_dir / "0").exists()


def test_a_setting_no_point_of_the_search_space_reads_is_refused_before_the_study(tmp_path):
    # An earlier study's sweep directory: the refusal leaves it as it was.
    sweep_dir = tmp_path / "study"
    (sweep_dir / "0").mkdir(parents=True)
    (sweep_dir / "optuna.db").write_bytes(b"an earlier study")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in sweep_dir.rglob("*"))
    searched = ["hydra/sweeper=optuna", "loss=choice(sigmoid,ipo)", "loss.beta=interval(0.05, 0.5)"]
    hint = run_sweep(sweep_dir, *searched, "model.install_hint=pip install x", timeout=120)
    assert hint.returncode == 1 and hint.stderr.strip().splitlines()[-1] == (
        "error: model.install_hint: set, but not read at any of the 2 points that set it: it is shown only when a "
        "model.gguf_file cannot be found (accepted: a model.gguf_file; or leave model.install_hint out); no job was "
        "started"), hint.output[-2000:]
    # A searched key is a setting too; an interval alone is one point, at its middle.
    groups = run_sweep(sweep_dir, "hydra/sweeper=optuna", "fsdp=choice(full_shard,shard_grad_op)",
                       "resources.nproc_per_node=2", "fsdp.hybrid_group_size=choice(1, 2)", timeout=120)
    assert groups.returncode == 1 and groups.stderr.strip().splitlines()[-1].startswith(
        "error: fsdp.hybrid_group_size: set, but not read at any of the 4 points that set it: only hybrid_shard "
        "has shard groups"), groups.output[-2000:]
    one = run_sweep(sweep_dir, "hydra/sweeper=optuna", "loss.beta=interval(0.05, 0.5)", "faults.step=3", timeout=120)
    assert one.returncode == 1 and one.stderr.strip().splitlines()[-1].startswith(
        "error: faults.step: set, but not read at the one point of the search space checked: no fault is injected"
    ), one.output[-2000:]
    assert sorted((p.name, p.stat().st_mtime_ns) for p in sweep_dir.rglob("*")) == before
    # Read at some points of the space (with hybrid_shard, or at sample_prompts=2): the study goes on.
    some = run_sweep(tmp_path / "some", "hydra/sweeper=optuna", "fsdp=choice(full_shard,hybrid_shard)",
                     "resources.nproc_per_node=2", "fsdp.hybrid_group_size=2", "train.save_model=true",
                     "train.sample_prompts=range(0, 3, step=2)", "train.sample_max_new_tokens=4",
                     "hydra.sweeper.dry_run=true", timeout=120)
    assert some.returncode == 0 and "dry run: study 'dpo_sweeps'" in some.stdout, some.output[-2000:]
    # Past 32 combinations the points are a sample, which may miss the one that reads a setting: a warning.
    sampled = run_sweep(tmp_path / "sampled", "hydra/sweeper=optuna", "loss=choice(sigmoid,ipo,hinge,robust,simpo,orpo)",
                        "precision=choice(fp32,bf16,fp16)", "train.micro_batch_size=choice(1,2)", "faults.step=3",
                        "hydra.sweeper.dry_run=true", timeout=120)
    assert sampled.returncode == 0 and "dry run: study 'dpo_sweeps'" in sampled.stdout, sampled.output[-2000:]
    assert "faults.step: set, but not read at any of the 32 points that set it" in sampled.output
    assert "drawn from the search space" in sampled.output


def test_idle_slot_time_counts_empty_slots_until_the_last_trial_starts():
    from dpo_sweeps.launchers.trial_slots import SlotRun, idle_slot_seconds

    # Two slots: A runs 0-10; B runs 0-4, then the slot waits a second for C (5-10), the last trial.
    runs = [SlotRun(None, 0, 0.0, 10.0), SlotRun(None, 1, 0.0, 4.0), SlotRun(None, 2, 5.0, 10.0)]
    assert idle_slot_seconds(runs, slots=2, sweep_start=0.0, sweep_end=10.0, trials=3) == pytest.approx(1.0)
