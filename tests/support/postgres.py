"""A throwaway PostgreSQL server on loopback, with a role that logs in by password (scram-sha-256): an
Optuna RDB storage whose URL must carry the password to work (tests/install_system_deps.sh installs it)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Postgres:
    port: int
    user: str
    password: str
    database: str

    def url(self, password: str | None = None) -> str:
        return (f"postgresql+psycopg2://{self.user}:{self.password if password is None else password}"
                f"@127.0.0.1:{self.port}/{self.database}")


def postgres_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return os.path.dirname(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres_server(password: str, user: str = "alice", database: str = "optuna") -> Iterator[Postgres]:
    """A server of its own in a temporary folder (owned by the `postgres` user: the server refuses to run as
    root), stopped and removed on exit."""
    bindir = postgres_bin()
    if bindir is None:
        raise RuntimeError("PostgreSQL not found: apt-get install -y postgresql (tests/install_system_deps.sh)")
    # In /tmp itself: the test run's own TMPDIR is private to root, and a socket path must stay short.
    home = tempfile.mkdtemp(prefix="dpo-pg-", dir="/tmp")
    os.chmod(home, 0o755)
    shutil.chown(home, "postgres")
    data, port = os.path.join(home, "data"), _free_port()

    def as_postgres(*args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True, timeout=120)

    try:
        pwfile = os.path.join(home, "superuser")
        with open(pwfile, "w") as f:
            f.write("unused\n")
        shutil.chown(pwfile, "postgres")
        as_postgres(f"{bindir}/initdb", "-D", data, "-U", "postgres", "--auth-local=trust",
                    "--auth-host=scram-sha-256", f"--pwfile={pwfile}")
        as_postgres(f"{bindir}/pg_ctl", "-D", data, "-w", "-l", os.path.join(home, "log"), "start", "-o",
                    f"-p {port} -k {home} -c listen_addresses=127.0.0.1")
        sql = (f"CREATE ROLE {user} LOGIN PASSWORD '{password}'; ")
        as_postgres(f"{bindir}/psql", "-h", home, "-p", str(port), "-U", "postgres", "-c", sql)
        as_postgres(f"{bindir}/createdb", "-h", home, "-p", str(port), "-U", "postgres", "-O", user, database)
        yield Postgres(port, user, password, database)
    finally:
        subprocess.run(["runuser", "-u", "postgres", "--", f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        time.sleep(0.2)
        shutil.rmtree(home, ignore_errors=True)
