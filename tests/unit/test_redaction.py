"""The rules that decide what is a secret (dpo_sweeps/redaction.py), one example each, and what they keep."""

from __future__ import annotations

import io

import pytest

from dpo_sweeps.redaction import (
    REDACTED,
    RedactedStream,
    is_secret_key,
    redact_text,
    scrub_overrides,
    scrub_secrets,
    secret_values,
)


@pytest.mark.parametrize(("text", "redacted"), [
    # A URI's password; the user stays. '@' inside a password: the netloc's last '@' ends the userinfo.
    ("http://alice:PASSWORD@127.0.0.1:9", "http://alice:<redacted>@127.0.0.1:9"),
    ("postgresql+psycopg2://bob:p@ss@db:5432/optuna", "postgresql+psycopg2://bob:<redacted>@db:5432/optuna"),
    # A userinfo with no password: a token when long, a user name when short.
    ("https://ghp_abcdefghijklmnopqrstuvwxyz0123@github.com/x.git", "https://<redacted>@github.com/x.git"),
    ("ssh://git@github.com/x", "ssh://git@github.com/x"),
    # Query parameters named as secrets, wherever the URI stands (inside an override's value too).
    ("data.path='https://h/pairs.jsonl?token=T0K3N&split=test'", "data.path='https://h/pairs.jsonl?token=<redacted>&split=test'"),
    ("s3://b/o?X-Amz-Signature=abcdef0123&x=1", "s3://b/o?X-Amz-Signature=<redacted>&x=1"),
    ("http://h/?key=zzz", "http://h/?key=<redacted>"),
    # Authorization header values keep their scheme; a Bearer credential anywhere.
    ("Authorization: Bearer eyJhbGciOi.payload.sig", "Authorization: Bearer <redacted>"),
    ("Authorization=Basic dXNlcjpwYXNzd29yZA==", "Authorization=Basic <redacted>"),
    ("{'Authorization': 'Token abc123def'}", "{'Authorization': 'Token <redacted>'}"),
    ("curl -H 'Bearer abcdefgh1234'", "curl -H 'Bearer <redacted>'"),
    # Header lines and pairs whose name is a secret key's.
    ("X-Api-Key: k3y-value-123", "X-Api-Key: <redacted>"),
    ('"password": "hunter22"', '"password": "<redacted>"'),
    ("+hydra.sweeper.hf_token=abcdefgh", "+hydra.sweeper.hf_token=<redacted>"),
])
def test_a_secret_inside_a_value_is_redacted(text, redacted):
    assert redact_text(text) == redacted
    assert redact_text(redacted) == redacted  # twice changes nothing


@pytest.mark.parametrize("text", [
    "loss.beta=0.1 train.max_tokens=12", "pad_token: <|endoftext|>", "Bearer of bad news", "password: null",
    "tokenizer.kind=byte", "see http://user@host/ and postgresql://alice:@host/db", "perf/tokens_per_s: 1200.5",
    "file:///work/data/pairs.jsonl", "sqlite:////tmp/optuna.db",
])
def test_ordinary_values_are_kept(text):
    assert redact_text(text) == text


def test_key_names_follow_the_rule_for_config_keys_and_environment_variables():
    assert all(is_secret_key(k) for k in ("hf_token", "WANDB_API_KEY", "db-password", "tracking.mlflow.token",
                                          "AWS_SECRET_ACCESS_KEY", "client_secret"))
    assert not any(is_secret_key(k) for k in ("tokenizer", "max_tokens", "pad_token", "PWD", "key", "path"))


def test_a_config_tree_and_its_overrides_are_scrubbed_by_key_and_by_value():
    tree = {"hf_token": "abcdefgh", "tracking": {"mlflow": {"tracking_uri": "http://a:pw12345@h:5000"}},
            "backends": ["mlflow"], "n": 3, "none_token": None}
    assert scrub_secrets(tree) == {"hf_token": REDACTED, "tracking": {"mlflow": {"tracking_uri": "http://a:<redacted>@h:5000"}},
                                   "backends": ["mlflow"], "n": 3, "none_token": None}
    assert scrub_overrides(["hf_token=abcdefgh", "x.uri=http://a:pw12345@h", "loss.beta=0.1"]) == \
        ["hf_token=<redacted>", "x.uri=http://a:<redacted>@h", "loss.beta=0.1"]


def test_known_values_are_found_by_key_by_value_and_in_the_environment_then_redacted_alone():
    known = secret_values({"db": {"url": "postgresql://u:pgpassword1@h/d"}, "api_key": "sk-123456"},
                          {"HF_TOKEN": "hf_abcdefgh", "HEADERS": "Authorization: Bearer b34rer-cred", "PWD": "/work"})
    assert known == {"pgpassword1", "sk-123456", "hf_abcdefgh", "b34rer-cred"}
    # Alone, in a driver's error message: redacted where it stands.
    assert redact_text("FATAL: password pgpassword1 rejected", known) == "FATAL: password <redacted> rejected"


def test_a_redacted_stream_writes_what_it_is_given_less_the_secrets():
    out = io.StringIO()
    stream = RedactedStream(out)
    print("storage: postgresql://alice:s3cretpw@db/optuna", file=stream)
    assert out.getvalue() == "storage: postgresql://alice:<redacted>@db/optuna\n"
    assert stream.getvalue() == out.getvalue()  # everything else is the stream's own
