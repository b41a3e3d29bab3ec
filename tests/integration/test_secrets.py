"""A credential typed into a value (a URI's password, a `?token=`, an `Authorization` header) reaches no
file the run, the sweep or the report writes, nor what the command prints (dpo_sweeps/redaction.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import QUIET, REPO, cli_env, run_cli  # noqa: E402
from support.postgres import postgres_bin, postgres_server  # noqa: E402
from support.sweeps import run_sweep  # noqa: E402

PASSWORD = "Hunter2-pw-7f3a9c"


def files_holding(secret: str, *roots: Path) -> list[str]:
    """Every file under roots whose bytes hold the secret: text, JSON, YAML, logs, pickles, databases."""
    found = []
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file() and secret.encode() in path.read_bytes():
                found.append(str(path))
    return found


def test_a_password_in_the_mlflow_uri_is_refused_and_reaches_no_file(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(run_dir, "model=tiny_llama", "tracking.backends=[mlflow]",
                     f"tracking.mlflow.tracking_uri=http://alice:{PASSWORD}@127.0.0.1:9")
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "tracking.mlflow.tracking_uri: holds a user or password" in line and "MLFLOW_TRACKING_PASSWORD" in line
    assert PASSWORD not in result.stdout + result.stderr
    summary = result.summary
    assert summary["failure"]["kind"] == "invalid_config"
    assert summary["config"]["tracking"]["mlflow"]["tracking_uri"] == "http://alice:<redacted>@127.0.0.1:9"
    assert (run_dir / ".hydra" / "overrides.yaml").exists()
    assert files_holding(PASSWORD, run_dir) == []


def test_a_token_parameter_and_an_authorization_header_from_the_environment_reach_no_file(tmp_path):
    """A `?token=` typed into a setting, and an Authorization value that comes into the config from an
    environment variable (`${oc.env:...}`): each refused naming its setting, neither written or printed."""
    token, bearer = "tok_91c0ffee55aa", "eyJhbGciOiJIUzI1NiJ9.cGF5bG9hZA.c2ln"
    runs = {
        "data.path": ("data=preference", f"data.path='https://example.invalid/pairs.jsonl?token={token}'"),
        "wandb.group": ("wandb.mode=offline", "wandb.group=${oc.env:DPO_TEST_HEADERS}"),
    }
    env = {**cli_env(), "DPO_TEST_HEADERS": f"Authorization: Bearer {bearer}"}
    for setting, overrides in runs.items():
        run_dir = tmp_path / setting
        args = [sys.executable, "-m", "dpo_sweeps", *QUIET, *overrides, f"hydra.run.dir={run_dir}"]
        proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert f"{setting}: holds a credential" in proc.stderr
        for secret in (token, bearer):
            assert secret not in proc.stdout + proc.stderr
            assert files_holding(secret, run_dir) == []


def test_a_secret_config_key_of_a_completed_run_reaches_no_checkpoint_or_file(tmp_path):
    """A key named as a secret (`+model.hf_token`), taken on purpose: the run completes and its kept
    checkpoints' markers, like every other file, hold it redacted."""
    secret = "hf_5ecretT0kenValue"
    run_dir = tmp_path / "run"
    result = run_cli(run_dir, f"+model.hf_token={secret}", "train.max_steps=2", "checkpoint.every_steps=1",
                     "checkpoint.keep_when_completed=true", "resources.nproc_per_node=1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert list(run_dir.glob("checkpoints/step_*"))
    assert secret not in result.stdout + result.stderr
    assert files_holding(secret, run_dir) == []


@pytest.mark.slow
@pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL not installed (tests/install_system_deps.sh)")
def test_an_optuna_storage_with_a_password_works_and_no_file_holds_it(tmp_path):
    """A study in a PostgreSQL database whose role logs in by password: the sweep and its trials (which open
    the storage themselves to report to the pruner) reach it; the sweep directory (multirun.yaml, the jobs'
    pickles, trial.json, logs), the report and the output hold the URL redacted only."""
    sweep_dir = tmp_path / "study"
    with postgres_server(PASSWORD) as pg:
        result = run_sweep(sweep_dir, "hydra/sweeper=optuna", f"hydra.sweeper.storage={pg.url()}",
                           "hydra.sweeper.n_trials=2", "hydra.sweeper.pruner=median", "resources.nproc_per_node=1",
                           "train.max_steps=4", "train.eval_every=2", "loss.beta=interval(0.05, 0.5)")
        assert result.returncode == 0, result.output[-3000:]
        import optuna

        study = optuna.load_study(study_name="dpo_sweeps", storage=pg.url())
        assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
        # The trials reported their evaluations from their own processes, through the password they inherited.
        assert all(sorted(t.intermediate_values) == [2] for t in study.trials)
    assert PASSWORD not in result.output
    assert "alice:<redacted>@127.0.0.1" in (sweep_dir / "multirun.yaml").read_text()
    assert list(sweep_dir.glob(".submitit/*/*_submitted.pkl"))  # the jobs' pickles were written, and looked in
    report = subprocess.run([sys.executable, "analysis/report.py", str(sweep_dir)], cwd=REPO, env=cli_env(),
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert PASSWORD not in report.stdout + report.stderr
    assert files_holding(PASSWORD, sweep_dir) == []


def test_a_trial_without_the_password_in_its_environment_is_told_where_it_goes(tmp_path):
    from dpo_sweeps.train.study_storage import STORAGE_ENV, StorageRefused, open_storage

    os.environ.pop(STORAGE_ENV, None)
    with pytest.raises(StorageRefused, match=f"has its credential redacted and {STORAGE_ENV} does not hold it"):
        open_storage("postgresql://alice:<redacted>@127.0.0.1:1/optuna", setting="trial.json storage")


def string_settings() -> list[str]:
    """Every setting the schema types as a string (a str field, optional or not), by its dotted name."""
    import dataclasses
    import typing

    from dpo_sweeps import api
    from dpo_sweeps.config.schema import Config

    typed = Config.of(api_config_container(api.compose([])))
    found = []

    def walk(node, prefix):
        hints = typing.get_type_hints(type(node))
        for field in dataclasses.fields(node):
            value, name = getattr(node, field.name), f"{prefix}{field.name}"
            if dataclasses.is_dataclass(value):
                walk(value, name + ".")
            elif "str" in str(hints.get(field.name)) and "list" not in str(hints.get(field.name)).lower():
                found.append(name)

    walk(typed, "")
    return found


def api_config_container(cfg):
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=False)
    plain.pop("hydra")
    return OmegaConf.to_container(OmegaConf.create(plain), resolve=True)


SETTINGS = string_settings()
SECRET_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"


@pytest.mark.slow
def test_a_secret_in_any_string_setting_reaches_no_file_of_the_run():
    """Hypothesis draws a string setting of the schema and a URI with a password or a token parameter in it;
    the run (in this process, through the Python API) is refused or fails or runs; no file it leaves, and
    nothing it prints, holds the secret."""
    import contextlib
    import io
    import shutil
    import tempfile

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from dpo_sweeps import api
    from dpo_sweeps.errors import RunFailure

    forms = st.sampled_from(["https://user:{s}@example.invalid/x", "postgresql://u:{s}@127.0.0.1:1/db",
                             "https://example.invalid/p?token={s}&a=1", "s3://b/o?X-Amz-Signature={s}"])

    @settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
    @given(setting=st.sampled_from(SETTINGS), form=forms,
           secret=st.text(SECRET_ALPHABET, min_size=8, max_size=16).map(lambda s: "S3c" + s))
    def one(setting, form, secret):
        run_dir = Path(tempfile.mkdtemp(prefix="secret-run-"))
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
                try:
                    cfg = api.compose([*QUIET, "train.max_steps=1", f"{setting}='{form.format(s=secret)}'"],
                                      run_dir=run_dir)
                    summary = api.train(cfg)
                    assert summary.status == "failed" and summary.failure.kind == "invalid_config", setting
                except RunFailure as exc:
                    printed.write(str(exc))
            assert secret not in printed.getvalue(), setting
            assert files_holding(secret, run_dir) == [], setting
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)

    one()
