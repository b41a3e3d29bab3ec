"""The suite's own state (tests/support/isolation.py): a run started by a test writes its caches into the
test session's folder, never into the user's ~/.cache, so no test depends on what another one left there."""

from __future__ import annotations

import os
from pathlib import Path

from support import isolation, run_cli

STATE = isolation.start()  # the session's, made when tests/conftest.py was imported


def test_every_cache_of_a_test_session_lies_in_its_own_folder():
    for variable in ("DPO_SWEEPS_CACHE", "XDG_CACHE_HOME", "HF_HOME", "WANDB_DIR", "MPLCONFIGDIR", "TMPDIR"):
        assert Path(os.environ[variable]).is_relative_to(STATE.root), variable
    assert not STATE.root.is_relative_to(Path.home() / ".cache")


def test_a_run_fills_the_sessions_cache_and_leaves_the_users_alone(tmp_path):
    users = Path.home() / ".cache" / "dpo_sweeps"
    before = STATE.users_cache_changes()
    # bench_gpt2 trains and caches its tokenizer; the precomputed reference log-probs are cached too.
    result = run_cli(tmp_path / "run", "model=bench_gpt2", "train.max_steps=1", "train.eval_every=0",
                     "data.num_train_pairs=64", "data.num_eval_pairs=8", "train.batch_size=8")
    assert result.returncode == 0, result.stderr[-3000:]
    session_cache = Path(os.environ["DPO_SWEEPS_CACHE"])
    assert any((session_cache / "reference_logps").iterdir())
    assert STATE.users_cache_changes() == before, f"the run wrote into {users}"


def test_a_sessions_folder_lies_where_the_users_temporary_files_go_not_inside_another_session():
    """An xdist worker's folder goes beside its controller's: nested, it made the Unix socket Chromium
    creates under TMPDIR longer than the 107 bytes a socket path may have, and every browser test failed."""
    users_tmpdir = STATE.replaced["TMPDIR"] or "/tmp"  # tempfile's first choice when TMPDIR is unset
    assert STATE.root.parent == Path(users_tmpdir).resolve()
    socket = Path(os.environ["TMPDIR"]) / "org.chromium.Chromium.XXXXXX" / "SingletonSocket"
    assert len(str(socket).encode()) <= 107, socket
