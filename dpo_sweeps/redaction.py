"""What is a secret, and its redaction from everything a run or a sweep writes or prints.

One module decides, so that summary.json, `.hydra/`, multirun.yaml, the logs, tracker params, trial
records and the printed lines agree. The rules (docs/trackers.md, "Secrets"):

1. **Key names.** A config key or environment variable is secret when its last dotted part, lowercased
   with `-` read as `_`, is one of SECRET_NAMES or ends with `_` + one of them: `hf_token`,
   `WANDB_API_KEY`, `db-password` are; `tokenizer`, `max_tokens`, `pad_token` are not. Its whole
   value is secret.
2. **Values.** Inside any string, wherever it stands (a setting, an override, a log line, an error):
   - the password of a URI's userinfo (`scheme://user:PASSWORD@host`, the netloc as urllib's urlsplit
     reads it, so a raw `/` in a password ends it: percent-encode it; the user name stays), and a
     userinfo with no password that looks like a token (TOKEN_USERINFO_CHARS or more characters:
     `https://TOKEN@host`; `ssh://git@host` stays);
   - the value of a `name=value` pair (a query parameter, an override, a header written so) whose name
     is secret by rule 1 or one of VALUE_NAMES (`?token=`, `&key=`, `password=`, `X-Amz-Signature=`);
   - the credential of an `Authorization` (or `Proxy-Authorization`) header value, after its scheme
     (`Authorization: Bearer CRED`, `Authorization=Basic CRED`), and of any `Bearer CRED`;
   - the value of a `Name: value` header line whose name is secret by rule 1 (`X-Api-Key: KEY`).
3. **Known values.** The secrets a run knows (rule 1's values in its config and environment, rule 2's
   found inside any config value or environment variable) are replaced wherever they appear, alone
   too, once they are MIN_KNOWN_LENGTH characters or longer (a shorter one would match by chance; rule 2
   still finds it where it stands in a URI or a pair).

A redacted secret reads REDACTED; redacting twice changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "<redacted>"

# Rule 1: a key is secret when its name is one of these or ends with "_" + one of them.
SECRET_NAMES = ("api_key", "apikey", "token", "secret", "password", "passwd", "credentials", "credential",
                "signature", "private_key", "access_key")
# Tokenizers' special tokens end in "_token" and are no secret (`pad_token: <|endoftext|>` in a log line).
NOT_SECRET = ("pad_token", "eos_token", "bos_token", "unk_token", "sep_token", "cls_token", "mask_token")
# Rule 2: names secret as `name=value` pairs only (query strings: `?key=`, `&sig=`), not as config keys.
VALUE_NAMES = ("key", "sig", "auth", "pwd", "pass", "code_verifier")
# A userinfo without a password this long is a token (GitHub's, Databricks'), not a user name.
TOKEN_USERINFO_CHARS = 20
MIN_KNOWN_LENGTH = 6

_AUTH_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?(?:[A-Za-z][\w-]*\s+)?)([^\s'\",;&}\]]+)")
_BEARER = re.compile(r"(?i)\b(bearer\s+)([A-Za-z0-9\-._~+/]{8,}=*)")
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^/?#\s'\"]*)")
# A name, `=` or `:` (a quote either side: JSON, a dict's repr, a quoted override), and the value.
# The value is read in a lookahead, so that a pair inside another's value (`path=https://h/?token=T`) is
# found too.
_PAIR = re.compile(r"(?<![\w\-])([A-Za-z][\w\-.]*)(['\"]?=['\"]?)(?=([^&\s#;,'\"\]}]+))")
_HEADER_LINE = re.compile(r"(?<![\w\-])([A-Za-z][\w\-]*)(['\"]?:[ \t]*['\"]?)(?=([^\s'\",;&}\]]+))")


def is_secret_key(key: Any) -> bool:
    """Rule 1: whether a config key or environment variable named `key` holds a secret."""
    name = str(key).lower().replace("-", "_").rsplit(".", 1)[-1]
    return name not in NOT_SECRET and any(name == s or name.endswith("_" + s) for s in SECRET_NAMES)


def _is_secret_pair_name(name: str) -> bool:
    last = name.lower().replace("-", "_").rsplit(".", 1)[-1]
    return is_secret_key(last) or last in VALUE_NAMES


def _userinfo_secret(netloc: str) -> tuple[int, int] | None:
    """Where in a URI's netloc its secret stands (start, end), or None."""
    userinfo, at, _ = netloc.rpartition("@")
    if not at or not userinfo:
        return None
    user, colon, password = userinfo.partition(":")
    if colon:
        return (len(user) + 1, len(userinfo)) if password else None
    return (0, len(userinfo)) if len(userinfo) >= TOKEN_USERINFO_CHARS else None


def _spans(text: str) -> list[tuple[int, int]]:
    """Rule 2: where the secrets inside `text` stand, as (start, end) spans."""
    spans = [m.span(2) for m in _AUTH_HEADER.finditer(text) if m.group(2) != REDACTED]
    spans += [m.span(2) for m in _BEARER.finditer(text)]
    for m in _URI.finditer(text):
        inner = _userinfo_secret(m.group(2))
        if inner is not None:
            spans.append((m.start(2) + inner[0], m.start(2) + inner[1]))
    for pattern in (_PAIR, _HEADER_LINE):
        for m in pattern.finditer(text):
            name = m.group(1)
            if "authorization" in name.lower():  # _AUTH_HEADER keeps the scheme readable
                continue
            secret = _is_secret_pair_name(name) if pattern is _PAIR else is_secret_key(name)
            if secret and m.group(3) not in ("null", "None", "???", REDACTED):
                spans.append(m.span(3))
    return spans


def secrets_in_text(text: str) -> set[str]:
    """Rule 2: the secret strings inside `text` (a URI's password, a token parameter's value, ...)."""
    return {text[a:b] for a, b in _spans(text) if text[a:b] != REDACTED}


def redact_text(text: str, known: Iterable[str] = ()) -> str:
    """`text` with every secret replaced by REDACTED: rule 3's known values, then rule 2's patterns."""
    for secret in sorted((s for s in known if len(s) >= MIN_KNOWN_LENGTH), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    spans = sorted(_spans(text))
    if not spans:
        return text
    out, last = [], 0
    for start, end in spans:
        if start < last:  # overlapping finds (a Bearer inside an Authorization header): one redaction
            continue
        out += [text[last:start], REDACTED]
        last = end
    return "".join(out) + text[last:]


def scrub_secrets(value: Any) -> Any:
    """A copy of a config tree (or any JSON-like record) with rule 1's keys' values and rule 2's secrets
    inside string values replaced."""
    if isinstance(value, Mapping):
        return {k: REDACTED if is_secret_key(k) and v is not None else scrub_secrets(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_secrets(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def scrub_overrides(overrides: Iterable[str]) -> list[str]:
    """Hydra override strings with rule 1's keys' values and rule 2's secrets replaced."""
    out = []
    for override in overrides:
        key, sep, _ = override.partition("=")
        out.append(f"{key}={REDACTED}" if sep and is_secret_key(key.lstrip("+~")) else redact_text(override))
    return out


def secret_values(config: Any, environ: Mapping[str, str]) -> set[str]:
    """Rule 3: the secret strings a run knows, from its config tree and its environment."""
    found: set[str] = set()
    for name, value in environ.items():
        found |= {value} if is_secret_key(name) else secrets_in_text(value)

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if is_secret_key(k) and isinstance(v, (str, int)):
                    found.add(str(v))
                else:
                    walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)
        elif isinstance(node, str):
            found.update(secrets_in_text(node))

    walk(config)
    return {s for s in found if len(s) >= MIN_KNOWN_LENGTH and s != REDACTED}


_environment_read: tuple[tuple[tuple[str, str], ...], set[str]] = ((), set())


def environment_secrets() -> set[str]:
    """Rule 3's secrets of this process's environment, read again whenever it changed (a sweeper adds
    its storage's) and only then: every write to a redacted stream asks."""
    import os

    global _environment_read
    items = tuple(os.environ.items())
    if items != _environment_read[0]:
        _environment_read = (items, secret_values({}, os.environ))
    return _environment_read[1]


class RedactedStream:
    """A text stream that redacts what is written to it (rule 2, and this process's environment's
    secrets) before the stream beneath writes it: `print`, tracebacks and logging's console handlers."""

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(redact_text(text, environment_secrets()))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, buffer: the stream's own
        return getattr(self.stream, name)


def redact_output() -> None:
    """From here on this process's stdout and stderr are redacted. Called where a process of the package
    starts (the command, a local rank, a submitted job's task), never by an import: a program that calls
    the Python API keeps its own streams."""
    import sys

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactedStream):
            setattr(sys, name, RedactedStream(stream))
