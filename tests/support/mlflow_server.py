"""A real `mlflow server` on a loopback port (sqlite backend store, local artifact store), and reading it
back through MLflow's REST API with urllib: the tests check what the tracker wrote without the client
the tracker itself uses.

`mlflow_server` (tests/conftest.py) is one server for the whole session; a test that kills its server
starts its own `MlflowServer`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """`admin_password`: MLflow's basic-auth app in front (user `admin`), so clients need credentials."""

    def __init__(self, root: Path, port: int | None = None, admin_password: str | None = None):
        self.root = Path(root)
        self.admin_password = admin_password
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> MlflowServer:
        if shutil.which("mlflow", path=str(Path(sys.executable).parent)) is None:
            pytest.fail("mlflow is not installed: pip install -e '.[test]' installs it (the trackers extra)")
        self.root.mkdir(parents=True, exist_ok=True)
        args = [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination", str(self.root / "artifacts"), "--workers", "1"]
        env = dict(os.environ)
        if self.admin_password:
            config = self.root / "basic_auth.ini"
            config.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{self.root / 'auth.db'}\n"
                              "admin_username = admin\nauthorization_function = "
                              "mlflow.server.auth:authenticate_request_basic_auth\n")
            env.update(MLFLOW_AUTH_CONFIG_PATH=str(config), MLFLOW_AUTH_ADMIN_PASSWORD=self.admin_password,
                       MLFLOW_FLASK_SERVER_SECRET_KEY="tests-only-secret-key")
            args += ["--app-name", "basic-auth"]
        self.log = open(self.root / "server.log", "ab")  # noqa: SIM115 (open while the server runs)
        # Its own process group: killing it kills the uvicorn workers too.
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"mlflow server did not answer in {timeout:.0f} s: {(self.root / 'server.log').read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()

    # ---- MLflow's REST API (https://mlflow.org/docs/latest/api_reference/rest-api.html)
    def get(self, endpoint: str, **query) -> dict:
        url = f"{self.uri}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=30) as reply:
            return json.loads(reply.read())

    def post(self, endpoint: str, body: dict) -> dict:
        request = urllib.request.Request(f"{self.uri}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())

    def experiment_id(self, name: str) -> str:
        return self.get("experiments/get-by-name", experiment_name=name)["experiment"]["experiment_id"]

    def runs(self, experiment: str, filter_string: str = "") -> list[dict]:
        """Every run of the experiment (REST runs/search), as {info, data: {params, tags, metrics}}."""
        runs, token = [], None
        while True:
            body = {"experiment_ids": [self.experiment_id(experiment)], "filter": filter_string, "max_results": 1000}
            if token:
                body["page_token"] = token
            reply = self.post("runs/search", body)
            runs += reply.get("runs", [])
            token = reply.get("next_page_token")
            if not token:
                return runs

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """The metric's every logged (step, value), as the server holds them (duplicates included)."""
        points = self.get("metrics/get-history", run_id=run_id, metric_key=key, max_results=25000)
        return sorted((int(m.get("step", 0)), m["value"]) for m in points.get("metrics", []))

    def artifacts(self, run_id: str, path: str = "") -> list[str]:
        reply = self.get("artifacts/list", run_id=run_id, **({"path": path} if path else {}))
        return sorted(f["path"] for f in reply.get("files", []))


def tags_of(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def params_of(run: dict) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real MLflow server for the session's tests (each uses its own experiment)."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.kill()
