"""tracking.backends against the real trackers: a real `mlflow server` (tests/support/mlflow_server.py, read
back through its REST API with urllib, not the client the tracker uses) and TensorBoard's own event reader.

A sweep is one view (a parent run, nested runs tagged by sweep, stage and plan, every metric at every step,
summary.json and the report as artifacts); a killed and resumed run continues its tracker run with each
step once; a server killed mid-run costs one warning, never the run; an upload afterwards sends what the
tracker lacks, and again adds nothing; bad choices are refused before any job starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO, cli_env, summary_json
from support.mlflow_server import MlflowServer, params_of, tags_of
from support.sweeps import run_sweep
from support.wandb_records import read_records

from dpo_sweeps.checks.validate import validate_config
from dpo_sweeps.config.schema import Config
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.rundir.lock import RunDirInUse, RunDirLock

SHORT = ["wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false", "data.num_train_pairs=64",
         "data.num_eval_pairs=16"]


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _expected_history(run_dir: Path, key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in _records(run_dir) if r.get(key) is not None]


def _scalars(event_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(event_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _hparams(event_dir: Path) -> dict[str, object]:
    """The settings the HParams plugin holds for a run (its session-start record)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    events = EventAccumulator(str(event_dir))
    events.Reload()
    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    return {key: getattr(value, value.WhichOneof("kind")) for key, value in start.hparams.items()}


def _close(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    return [s for s, _ in a] == [s for s, _ in b] and all(abs(x - y) < 1e-5 for (_, x), (_, y) in zip(a, b))


# ---------------------------------------------------------------- refused before any job starts
def _config(tracking: dict) -> Config:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        resolved = OmegaConf.to_container(compose("config"), resolve=True)
    resolved["tracking"] = {**resolved["tracking"], **tracking}
    return Config.of(resolved)


@pytest.mark.parametrize(("tracking", "line"), [
    ({"backends": ["wandb", "comet"]},
     "tracking.backends: got 'comet' (accepted: a list of wandb, mlflow, tensorboard, trackio)"),
    ({"backends": ["mlflow"], "mlflow": {"tracking_uri": "localhost:5000"}},
     "tracking.mlflow.tracking_uri: got 'localhost:5000', whose scheme 'localhost' is not an MLflow store's"),
    ({"backends": ["mlflow"], "mlflow": {"tracking_uri": "http://:5000"}},
     "tracking.mlflow.tracking_uri: got 'http://:5000', with no host to reach"),
    ({"backends": ["mlflow"], "mlflow": {"tracking_uri": "http://127.0.0.1:port"}},
     "tracking.mlflow.tracking_uri: got 'http://127.0.0.1:port', not a URI"),
    ({"backends": ["mlflow"], "mlflow": {"tracking_uri": "https://me:hunter2@mlflow.example.com"}},
     "tracking.mlflow.tracking_uri: holds a user or password; they are read from the environment, never stored"),
])
def test_a_bad_tracking_choice_is_refused_in_one_line_naming_the_setting(tracking, line):
    with pytest.raises(InvalidConfig) as refused:
        validate_config(_config(tracking), REPO)
    assert str(refused.value).startswith(line), str(refused.value)
    assert "\n" not in str(refused.value) and "hunter2" not in str(refused.value)


def test_mlflow_without_a_uri_anywhere_is_refused(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(InvalidConfig, match=r"^tracking.mlflow.tracking_uri: not set, nor MLFLOW_TRACKING_URI"):
        validate_config(_config({"backends": ["mlflow"]}), REPO)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://u:secret-pw@host:5000")
    with pytest.raises(InvalidConfig, match=r"^MLFLOW_TRACKING_URI: holds a user or password") as refused:
        validate_config(_config({"backends": ["mlflow"]}), REPO)
    assert "secret-pw" not in str(refused.value)


def test_a_tracker_whose_library_is_not_installed_is_refused_with_its_pip_command(tmp_path):
    # The library made unimportable for real in a fresh process (sys.modules[name] = None is how Python
    # marks a module that cannot be imported), then the CLI: refused before the run starts.
    code = ("import sys, runpy; sys.modules['trackio'] = None; "
            f"sys.argv = ['dpo_sweeps', 'tracking.backends=[trackio]', 'hydra.run.dir={tmp_path / 'run'}']; "
            "runpy.run_module('dpo_sweeps', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert ("tracking.backends: names trackio, whose library trackio is not installed (accepted: "
            "`pip install trackio`, or tracking.backends without trackio)") in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---------------------------------------------------------------- a sweep is one view
@pytest.fixture(scope="module")
def mlflow_sweep(mlflow_server, tmp_path_factory):
    """A 4-job grid sweep logged to MLflow and TensorBoard, then its report."""
    sweep_dir = tmp_path_factory.mktemp("trackers") / "sweep"
    result = run_sweep(sweep_dir, "loss.beta=0.1,0.2", "train.lr=1e-3,2e-3", "train.max_steps=4",
                       "train.eval_every=2", "tracking.backends=[mlflow,tensorboard]",
                       f"tracking.mlflow.tracking_uri={mlflow_server.uri}", "tracking.mlflow.experiment_name=sweep")
    assert result.returncode == 0, result.output[-3000:]
    report = subprocess.run([sys.executable, "-m", "dpo_sweeps.analysis.report", str(sweep_dir)], cwd=REPO,
                            env=cli_env(), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    return result, report


@pytest.mark.slow
def test_a_sweep_is_one_parent_run_with_a_nested_run_per_job_holding_every_metric(mlflow_server, mlflow_sweep):
    result, report = mlflow_sweep
    runs = mlflow_server.runs("sweep")
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in tags_of(r)]
    jobs = [r for r in runs if tags_of(r).get("mlflow.parentRunId") == parent["info"]["run_id"]]
    assert len(runs) == 5 and len(jobs) == 4
    assert tags_of(parent)["dpo_sweeps.sweep"] == "sweep"
    # The report logged its page and ranking to the parent, and marked it finished (every job has ended).
    assert mlflow_server.artifacts(parent["info"]["run_id"], "report") == ["report/ranking.csv", "report/report.html"]
    assert parent["info"]["status"] == "FINISHED" or \
        mlflow_server.get("runs/get", run_id=parent["info"]["run_id"])["run"]["info"]["status"] == "FINISHED"
    assert "Logged report.html and ranking.csv to the sweep's MLflow run" in report.stdout

    settings = set()
    for job in jobs:
        run_id, tags, params = job["info"]["run_id"], tags_of(job), params_of(job)
        run_dir = result.sweep_dir / tags["mlflow.runName"].split("/")[-1]
        summary = result.summary(run_dir.name)
        assert job["info"]["status"] == "FINISHED"
        assert tags["dpo_sweeps.sweep"] == "sweep" and tags["dpo_sweeps.stage"] == "train"
        assert tags["dpo_sweeps.plan"] == summary["plan"]["label"] and tags["dpo_sweeps.status"] == "completed"
        assert params["loss.beta"] == str(summary["config"]["loss"]["beta"])
        assert params["train.lr"] == str(summary["config"]["train"]["lr"])
        assert params["model.tokenizer.kind"] == "byte"
        settings.add((params["loss.beta"], params["train.lr"]))
        # Every metric of metrics.jsonl at every step, once.
        keys = {k for r in _records(run_dir) for k, v in r.items() if k != "step" and isinstance(v, (int, float))}
        assert {"train/loss", "eval/rewards/accuracies", "perf/step_time_s"} <= keys
        for key in keys:
            assert _close(mlflow_server.history(run_id, key), _expected_history(run_dir, key)), key
        # Summary-only metrics at the last step; summary.json as an artifact.
        assert mlflow_server.history(run_id, "perf/tokens_per_s")[-1][0] == 4
        assert mlflow_server.artifacts(run_id) == ["summary.json"]
        assert summary["tracking"] == {"mlflow": {"where": mlflow_server.uri, "missed": None},
                                       "tensorboard": {"where": str(run_dir / "tensorboard"), "missed": None}}
    assert len(settings) == 4


@pytest.mark.slow
def test_a_sweep_in_tensorboard_is_an_event_dir_per_run_with_its_settings(mlflow_sweep):
    result, _ = mlflow_sweep
    betas = set()
    for run_dir in result.run_dirs():
        scalars = _scalars(run_dir / "tensorboard")
        for key in ("train/loss", "eval/rewards/accuracies", "train/grad_norm"):
            assert _close(scalars[key], _expected_history(run_dir, key)), key
        hparams = _hparams(run_dir / "tensorboard")
        assert hparams["dpo_sweeps.stage"] == "train" and hparams["model.tokenizer.kind"] == "byte"
        betas.add(hparams["loss.beta"])
    assert betas == {0.1, 0.2}


# A find_best of one plan probed for 3 steps, then two betas trained for 4 steps on it.
TINY_FIND_BEST = ["resources.nproc_per_node=1", "train.max_steps=4", "perf.warmup_steps=1",
                  "data.num_train_pairs=64", "data.num_eval_pairs=16",
                  "hydra.sweeper.stages={systems: {precision: fp32}, algorithm: {loss.beta: '0.1,0.5'}, "
                  "probe_steps: 3, top_k: 1}"]


@pytest.mark.slow
def test_a_find_best_sweep_is_one_parent_run_with_its_probe_and_train_jobs_nested_and_tagged_by_stage(
        mlflow_server, tmp_path):
    sweep_dir = tmp_path / "find_best"
    result = run_sweep(sweep_dir, *TINY_FIND_BEST, "tracking.backends=[mlflow]",
                       f"tracking.mlflow.tracking_uri={mlflow_server.uri}", "tracking.mlflow.experiment_name=find_best")
    assert result.returncode == 0, result.output[-3000:]
    report = subprocess.run([sys.executable, "-m", "dpo_sweeps.analysis.report", str(sweep_dir)], cwd=REPO,
                            env=cli_env(), capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]

    runs = mlflow_server.runs("find_best")
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in tags_of(r)]  # one for both stages
    parent_id = parent["info"]["run_id"]
    jobs = {tags_of(r)["mlflow.runName"]: r for r in runs if tags_of(r).get("mlflow.parentRunId") == parent_id}
    assert len(runs) == 4 and sorted(jobs) == ["find_best/0", "find_best/1", "find_best/2"]
    assert tags_of(parent)["dpo_sweeps.sweep"] == "find_best"
    assert tags_of(parent)["dpo_sweeps.sweep_dir"] == str(sweep_dir.resolve())  # the root, not a stage's folder
    assert [p.relative_to(sweep_dir) for p in sweep_dir.rglob("sweep_tracking.json")] == [Path("sweep_tracking.json")]
    stages = {name: tags_of(job)["dpo_sweeps.stage"] for name, job in jobs.items()}
    assert stages == {"find_best/0": "probe", "find_best/1": "train", "find_best/2": "train"}
    betas = set()
    for name, job in jobs.items():
        num = name.split("/")[-1]
        run_dir = sweep_dir / ("probes" if stages[name] == "probe" else "train") / num
        assert json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"] == job["info"]["run_id"]
        assert job["info"]["status"] == "FINISHED" and tags_of(job)["dpo_sweeps.status"] == "completed"
        assert params_of(job)["probe.steps"] == ("3" if stages[name] == "probe" else "0")
        assert _close(mlflow_server.history(job["info"]["run_id"], "train/loss"),
                      _expected_history(run_dir, "train/loss"))
        if stages[name] == "train":
            betas.add(params_of(job)["loss.beta"])
    assert betas == {"0.1", "0.5"}
    # The report of the root logged its page and ranking to the one parent, and finished it.
    assert mlflow_server.artifacts(parent_id, "report") == ["report/ranking.csv", "report/report.html"]
    assert mlflow_server.get("runs/get", run_id=parent_id)["run"]["info"]["status"] == "FINISHED"
    assert f"Logged report.html and ranking.csv to the sweep's MLflow run {parent_id}" in report.stdout


# ---------------------------------------------------------------- resume: each step once
def _wait_unlocked(run_dir: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            RunDirLock(run_dir).acquire().release()
            return
        except RunDirInUse:
            time.sleep(0.3)


@pytest.mark.slow
def test_a_killed_and_resumed_run_continues_its_tracker_runs_with_each_step_once(mlflow_server, tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dpo_sweeps", *SHORT[1:], "wandb.mode=offline", "train.max_steps=16",
            "train.eval_every=4", "checkpoint.every_steps=4", "tracking.backends=[mlflow,tensorboard,trackio,wandb]",
            f"tracking.mlflow.tracking_uri={mlflow_server.uri}", "tracking.mlflow.experiment_name=resume",
            "tracking.trackio.project=resume", f"hydra.run.dir={run_dir}"]
    env = {**cli_env(), "TRACKIO_DIR": str(tmp_path / "trackio")}
    env.pop("WANDB_MODE", None)
    first = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (
                (run_dir / "checkpoints" / "step_4").exists() and (run_dir / "metrics.jsonl").exists()
                and _records(run_dir)[-1]["step"] >= 6):
            assert first.poll() is None, "the run ended before it could be killed"
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    _wait_unlocked(run_dir)
    state = json.loads((run_dir / "tracking.json").read_text())
    killed_at = _records(run_dir)[-1]["step"]

    again = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = summary_json(run_dir)
    assert summary["resumed_from_step"] and summary["resumed_from_step"] < killed_at
    assert json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"] == state["mlflow"]["run_id"]
    (run,) = mlflow_server.runs("resume")  # the same run, continued
    assert run["info"]["run_id"] == state["mlflow"]["run_id"] and run["info"]["status"] == "FINISHED"
    for key in ("train/loss", "eval/rewards/accuracies"):
        expected = _expected_history(run_dir, key)
        assert [s for s, _ in expected] == (list(range(1, 17)) if key == "train/loss" else [4, 8, 12, 16])
        assert _close(mlflow_server.history(run["info"]["run_id"], key), expected), key
        assert _close(_scalars(run_dir / "tensorboard")[key], expected), key
        assert _close(_trackio_history(env, "resume", "run", key), expected), key

    # W&B offline cannot be asked what it holds: the resumed attempt writes a second offline record under
    # the same run id, and replays metrics.jsonl into it whole, so that record alone has every step once.
    records = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(records) == 2 and all(r.parent.name.endswith("-" + state["wandb"]["id"]) for r in records)
    ids = {rec.run.run_id for path in records for rec in read_records(path) if rec.WhichOneof("record_type") == "run"}
    assert ids == {state["wandb"]["id"]} and state["wandb"]["id"] == state["run_uid"]
    resumed = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
               for rec in read_records(records[-1]) if rec.WhichOneof("record_type") == "history"]
    losses = [(row["_step"], row["train/loss"]) for row in resumed if "train/loss" in row]
    assert _close(losses, _expected_history(run_dir, "train/loss")), resumed[:3]  # steps 1..16, once each


def _trackio_history(env: dict, project: str, run: str, key: str) -> list[tuple[int, float]]:
    """A metric's every (step, value) in Trackio's database, read by Trackio's own storage in a process
    whose TRACKIO_DIR is the run's."""
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps([[r['step'], r[sys.argv[3]]] for r in S.get_logs(sys.argv[1], sys.argv[2]) "
            "if r.get(sys.argv[3]) is not None]))")
    out = subprocess.run([sys.executable, "-c", code, project, run, key], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return sorted((int(s), v) for s, v in json.loads(out.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------- a tracker that fails never fails training
ADMIN_PASSWORD = "admin-pw-5e6f7a8b9c0d"


@pytest.mark.slow
def test_refused_credentials_then_a_server_killed_mid_run_are_one_warning_each_and_an_upload_sends_the_run_once(
        mlflow_server, tmp_path):
    own = MlflowServer(tmp_path / "server", admin_password=ADMIN_PASSWORD).start()  # basic auth in front
    # Credentials the server refuses: one warning, the run completes.
    refused_dir = tmp_path / "refused"
    wrong = {**cli_env(), "MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "not-the-password"}
    proc = subprocess.run([sys.executable, "-m", "dpo_sweeps", *SHORT, "train.max_steps=3", "train.eval_every=0",
                           "tracking.backends=[mlflow]", f"tracking.mlflow.tracking_uri={own.uri}",
                           f"hydra.run.dir={refused_dir}"], cwd=REPO, env=wrong, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING" in line and "tracking:" in line]
    assert len(warnings) == 1 and f"tracking: mlflow at {own.uri} failed at the start" in warnings[0], warnings
    assert "401" in warnings[0] and "not-the-password" not in proc.stdout + proc.stderr
    assert summary_json(refused_dir)["tracking"]["mlflow"]["missed"] == "from the start"

    # The right credentials, from the environment only; then the server is killed mid-run.
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dpo_sweeps", *SHORT, "train.max_steps=40", "train.eval_every=10",
            "tracking.backends=[mlflow]", f"tracking.mlflow.tracking_uri={own.uri}",
            "tracking.mlflow.experiment_name=killed", f"hydra.run.dir={run_dir}"]
    right = {**cli_env(), "MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD}
    run = subprocess.Popen(args, cwd=REPO, env=right, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (
                (run_dir / "metrics.jsonl").exists() and len(_records(run_dir)) >= 3):
            assert run.poll() is None, "the run ended before the server could be killed"
            time.sleep(0.1)
        own.kill()
        stdout, stderr = run.communicate(timeout=300)
    finally:
        own.kill()
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr[-3000:]
    warnings = [line for line in (stdout + stderr).splitlines() if "WARNING" in line and "tracking:" in line]
    assert len(warnings) == 1, warnings
    assert f"tracking: mlflow at {own.uri} failed from step" in warnings[0]
    assert [r["step"] for r in _records(run_dir) if "train/loss" in r] == list(range(1, 41))  # metrics.jsonl whole
    summary = summary_json(run_dir)
    assert summary["status"] == "completed"
    assert summary["tracking"]["mlflow"]["where"] == own.uri
    assert summary["tracking"]["mlflow"]["missed"].startswith("from step")
    assert json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"]  # it had started there
    for path in run_dir.rglob("*"):
        assert not path.is_file() or ADMIN_PASSWORD.encode() not in path.read_bytes(), path
    assert ADMIN_PASSWORD not in stdout + stderr

    # The upload afterwards: every step once, summary.json, the status; uploading again adds nothing.
    upload = [sys.executable, "-m", "dpo_sweeps.analysis.report", str(run_dir), "--out", str(tmp_path / "report"),
              "--to", "mlflow", mlflow_server.uri]
    first = subprocess.run(upload, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Uploaded 1 runs to mlflow" in first.stdout and " 0 new metric points" not in first.stdout
    second = subprocess.run(upload, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert f"Uploaded 1 runs to mlflow at {mlflow_server.uri}: 0 new metric points" in second.stdout, second.stdout
    (uploaded,) = mlflow_server.runs("killed")
    run_id = uploaded["info"]["run_id"]
    assert uploaded["info"]["status"] == "FINISHED" and tags_of(uploaded)["dpo_sweeps.status"] == "completed"
    for key in ("train/loss", "eval/rewards/accuracies", "train/lr"):
        assert _close(mlflow_server.history(run_id, key), _expected_history(run_dir, key)), key
    assert mlflow_server.artifacts(run_id) == ["summary.json"]


@pytest.mark.slow
def test_a_server_down_at_the_start_is_one_warning_and_the_run_completes(tmp_path):
    from support.mlflow_server import free_port

    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dpo_sweeps", *SHORT, "train.max_steps=3", "train.eval_every=0",
            "tracking.backends=[mlflow,tensorboard]", f"tracking.mlflow.tracking_uri={uri}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING" in line and "tracking:" in line]
    assert len(warnings) == 1 and f"tracking: mlflow at {uri} failed at the start" in warnings[0], warnings
    summary = summary_json(run_dir)
    assert summary["status"] == "completed"
    assert summary["tracking"]["mlflow"] == {"where": uri, "missed": "from the start"}
    assert summary["tracking"]["tensorboard"]["missed"] is None  # the other backend got everything
    assert [s for s, _ in _scalars(run_dir / "tensorboard")["train/loss"]] == [1, 2, 3]


# ---------------------------------------------------------------- secrets reach no tracker
SECRET_CFG = "hf-token-9a8b7c6d5e4f"
SECRET_PASSWORD = "mlflow-pw-1f2e3d4c5b6a"
SECRET_WANDB = "wandb-key-77aa88bb99cc"


@pytest.mark.slow
def test_no_secret_reaches_any_tracker_file_or_log(mlflow_server, tmp_path):
    """Every backend at once, with a secret in the config and MLflow's password and W&B's key in the
    environment: each tracker gets the config with the secret redacted, and no byte of a secret is in any
    file the run, W&B, Trackio or the MLflow server wrote, nor in the output."""
    run_dir = tmp_path / "run"
    env = {**cli_env(), "TRACKIO_DIR": str(tmp_path / "trackio"), "WANDB_API_KEY": SECRET_WANDB,
           "MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": SECRET_PASSWORD}
    env.pop("WANDB_MODE", None)
    args = [sys.executable, "-m", "dpo_sweeps", *SHORT[1:], "wandb.mode=offline", "train.max_steps=3",
            "train.eval_every=0", "tracking.backends=[wandb,mlflow,tensorboard,trackio]",
            f"tracking.mlflow.tracking_uri={mlflow_server.uri}", "tracking.mlflow.experiment_name=secrets",
            "tracking.trackio.project=secrets", f"+model.hf_token={SECRET_CFG}", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = summary_json(run_dir)
    assert all(v["missed"] is None for v in summary["tracking"].values()), summary["tracking"]
    assert set(summary["tracking"]) == {"wandb", "mlflow", "tensorboard", "trackio"}

    (run,) = mlflow_server.runs("secrets")
    assert params_of(run)["model.hf_token"] == "<redacted>"
    assert _hparams(run_dir / "tensorboard")["model.hf_token"] == "<redacted>"
    (trackio_db,) = (tmp_path / "trackio").glob("secrets*.db")  # the project's database
    assert b"<redacted>" in trackio_db.read_bytes() and b"train/loss" in trackio_db.read_bytes()
    written = [p for root in (run_dir, tmp_path / "trackio", mlflow_server.root) for p in root.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in written) and any("tfevents" in p.name for p in written)
    for path in written:
        data = path.read_bytes()
        for secret in (SECRET_CFG, SECRET_PASSWORD, SECRET_WANDB):
            assert secret.encode() not in data, (secret, path)
    for secret in (SECRET_CFG, SECRET_PASSWORD, SECRET_WANDB):
        assert secret not in proc.stdout + proc.stderr
