"""A test session's own state: caches and temporary files in a folder of its own, removed at its end.

What the session's tests and the runs they start would otherwise share with the user and with each other:
dpo-sweeps' cache ($DPO_SWEEPS_CACHE: GGUF conversions, trained tokenizers, reference log-probs), the caches
under ~/.cache (Hugging Face, pip, matplotlib, torch), W&B's folders, and the temporary directory. Each of
them is pointed into the session's folder through the variable its library reads, so a test that needs a
warm cache fills it itself and no result depends on the order of the tests or on an earlier session.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Where the first session of a run (the xdist controller) leaves the user's own values for the others, and
# the temporary directory their environment gives.
USER_ENV = "DPO_SWEEPS_TESTS_USER_ENV"
USER_TEMPDIR = "DPO_SWEEPS_TESTS_USER_TEMPDIR"

# The variables each library reads for its folders under the user's home.
CACHE_VARIABLES = {
    "DPO_SWEEPS_CACHE": "dpo_sweeps",
    "XDG_CACHE_HOME": "",  # pip, matplotlib's font cache and anything else that follows the XDG spec
    "HF_HOME": "huggingface",
    "TORCH_HOME": "torch",
    "MPLCONFIGDIR": "matplotlib",
    "WANDB_DIR": "wandb",
    "WANDB_CACHE_DIR": "wandb/cache",
    "WANDB_CONFIG_DIR": "wandb/config",
    "WANDB_DATA_DIR": "wandb/data",
}


@dataclass(frozen=True)
class TestState:
    root: Path
    users_cache: Path
    users_cache_before: frozenset[str]
    replaced: dict[str, str | None]  # each variable pointed into `root`, with the user's value (as the run found it)

    def service_env(self) -> dict[str, str]:
        """The environment for a service a test starts that outlives the session (the local SLURM cluster's
        daemons and database): the variables as they were, not folders that go with the session."""
        env = {k: v for k, v in os.environ.items() if k not in (USER_ENV, USER_TEMPDIR)}
        for variable, value in self.replaced.items():
            if value is None:
                env.pop(variable, None)
            else:
                env[variable] = value
        return env

    @classmethod
    def create(cls) -> TestState:
        """A new folder for this session's state, with the environment pointed into it."""
        users_cache = Path.home() / ".cache" / "dpo_sweeps"
        before = _listing(users_cache)
        # The user's values, as the first session found them: an xdist worker inherits its controller's
        # folders, and a service must not get those either (they go when the controller's session ends).
        if USER_ENV not in os.environ:
            os.environ[USER_ENV] = json.dumps({v: os.environ.get(v) for v in (*CACHE_VARIABLES, "TMPDIR")})
            os.environ[USER_TEMPDIR] = tempfile.gettempdir()
        replaced = json.loads(os.environ[USER_ENV])
        # Beside the controller's folder, not inside it: a Unix socket's path is limited to 107 bytes, and a
        # nested folder left Chromium's (<TMPDIR>/org.chromium.Chromium.XXXXXX/SingletonSocket) over it.
        root = Path(tempfile.mkdtemp(prefix="dpo-sweeps-tests-", dir=os.environ[USER_TEMPDIR]))
        for variable, sub in CACHE_VARIABLES.items():
            folder = root / "cache" / sub
            folder.mkdir(parents=True, exist_ok=True)
            os.environ[variable] = str(folder)
        tmp = root / "tmp"
        tmp.mkdir()
        os.environ["TMPDIR"] = str(tmp)
        tempfile.tempdir = None  # re-read TMPDIR: pytest's tmp_path and every tempfile call land there
        return cls(root, users_cache, before, replaced)

    def users_cache_changes(self) -> list[str]:
        """Entries under the user's ~/.cache/dpo_sweeps that appeared or changed since the session began."""
        return sorted(_listing(self.users_cache) - self.users_cache_before)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _listing(folder: Path) -> frozenset[str]:
    """Every file and folder under `folder` with its size and modification time (empty if absent)."""
    if not folder.is_dir():
        return frozenset()
    return frozenset(f"{p.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}"
                     for p in folder.rglob("*") for st in [p.lstat()])


_current: TestState | None = None


def start() -> TestState:
    """This session's state, created by the first call (tests/conftest.py's import) and the same after."""
    global _current
    if _current is None:
        _current = TestState.create()
    return _current
