"""What `tracking.mlflow.tracking_uri` may be: checked before any job starts (checks/validate.py) and by
`dpo-sweeps-report --to mlflow` (analysis/upload.py)."""

from __future__ import annotations

from urllib.parse import urlsplit

# What an MLflow tracking URI may be (MLflow's own stores); a credential in it is refused (docs/trackers.md).
MLFLOW_URI_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks")
MLFLOW_URI_ACCEPTED = ("http(s)://host:port of an MLflow server, file:/path, sqlite:///path.db or another of "
                       f"{', '.join(MLFLOW_URI_SCHEMES)}; no user or password in it (MLFLOW_TRACKING_USERNAME, "
                       "MLFLOW_TRACKING_PASSWORD)")


def mlflow_uri_problem(uri: str) -> str | None:
    """Why `uri` is not an MLflow tracking URI this project accepts, or None."""
    try:
        parts = urlsplit(uri)
        port = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        return f"got {uri!r}, not a URI ({exc})"
    if parts.scheme.split("+")[0] not in MLFLOW_URI_SCHEMES:
        return f"got {uri!r}, whose scheme {parts.scheme or '(none)'!r} is not an MLflow store's"
    if parts.password is not None or (parts.username and parts.scheme in ("http", "https")):
        return "holds a user or password; they are read from the environment, never stored"
    if parts.scheme in ("http", "https") and (not parts.hostname or port == 0):
        return f"got {uri!r}, with no host to reach"
    return None
