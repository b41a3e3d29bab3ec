"""optuna-dashboard's web app called in-process (WSGI), to read what it shows of a study."""

from __future__ import annotations

import json
from typing import Any
from wsgiref.util import setup_testing_defaults


def dashboard_get(storage: Any, path: str, query: str = "") -> tuple[str, Any]:
    """(HTTP status, decoded JSON) of GET `path` on optuna-dashboard's app for `storage`."""
    import optuna_dashboard

    app = optuna_dashboard.wsgi(storage)
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=path, QUERY_STRING=query)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], json.loads(body)


def dashboard_trials(storage: Any, study_name: str) -> list[dict]:
    """The study's trials as the dashboard lists them (number, state, params, values, intermediate values)."""
    status, listing = dashboard_get(storage, "/api/studies")
    assert status.startswith("200"), status
    study_id = next(s["study_id"] for s in listing["study_summaries"] if s["study_name"] == study_name)
    status, study = dashboard_get(storage, f"/api/studies/{study_id}", "after=0")
    assert status.startswith("200"), status
    return study["trials"]
