"""Secrets a run knows (config keys named like tokens, secret environment variables), kept out of
what it writes: summary.json, .hydra/*.yaml, wandb."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dpo_sweeps.rundir.atomic import temporary_beside

# A key is secret when its name is one of these or ends with "_" + one of them (so `hf_token` is,
# `tokenizer` and `max_tokens` are not).
SECRET_NAMES = ("api_key", "apikey", "token", "secret", "password", "passwd", "credentials")

REDACTED = "<redacted>"


def is_secret_key(key: str) -> bool:
    name = str(key).lower().rsplit(".", 1)[-1]
    return any(name == s or name.endswith("_" + s) for s in SECRET_NAMES)


def scrub_secrets(value: Any) -> Any:
    """A copy of a config tree with any secret key's value replaced."""
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_key(k) and v is not None else scrub_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_secrets(v) for v in value]
    return value


def scrub_overrides(overrides: list[str]) -> list[str]:
    """Hydra override strings with the value of any secret key replaced."""
    out = []
    for override in overrides:
        key, sep, _ = override.partition("=")
        out.append(f"{key}={REDACTED}" if sep and is_secret_key(key.lstrip("+~")) else override)
    return out


def secret_values(config: Any, environ: dict[str, str]) -> set[str]:
    """The secret strings a run knows: values of secret config keys and of secret environment variables."""
    found: set[str] = {v for k, v in environ.items() if is_secret_key(k) and len(v) >= 6}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if is_secret_key(k) and isinstance(v, (str, int)) and len(str(v)) >= 6:
                    found.add(str(v))
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(config)
    return found


def redact_files(paths: list[Path], secrets: set[str]) -> None:
    """Replace every occurrence of a secret in these text files (Hydra's saved .hydra/*.yaml)."""
    for path in paths:
        if not secrets or not path.exists():
            continue
        text = path.read_text()
        redacted = text
        for secret in secrets:
            redacted = redacted.replace(secret, REDACTED)
        if redacted != text:
            tmp = temporary_beside(path)
            tmp.write_text(redacted)
            os.replace(tmp, path)
