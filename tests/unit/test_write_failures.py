"""A failed write, whatever raised it, is an OSError naming the path (dpo_sweeps/rundir/paths.py); the
libraries' own types, raised for real, are in tests/integration/test_faults_paths.py."""

from __future__ import annotations

import errno
import os

import pytest

from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.rundir.paths import failed_path, failed_write, is_path_error, refused_write, unwritable_text, writing


@pytest.mark.parametrize("raised, code", [
    (RuntimeError("[enforce fail at inline_container.cc:747] . open file failed with strerror: Permission denied"),
     errno.EACCES),  # torch.save
    (Exception("Read-only file system (os error 30)"), errno.EROFS),  # tokenizers (Rust's io::Error)
    (ValueError("Error while serializing: I/O error: No space left on device (os error 28) at path \"/x/.tmp1\""),
     errno.ENOSPC),  # safetensors
])
def test_a_library_s_words_for_a_path_problem_become_an_os_error_naming_the_path(tmp_path, raised, code):
    with pytest.raises(OSError) as caught, writing(tmp_path / "model"):
        raise raised
    assert (caught.value.errno, caught.value.filename) == (code, str(tmp_path / "model"))
    assert caught.value.__cause__ is raised and is_path_error(caught.value, within=tmp_path / "elsewhere")


def test_an_os_error_in_the_chain_keeps_its_file_and_one_without_gets_the_path(tmp_path):
    try:
        try:
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "a" / "f"))
        except OSError as inner:
            raise RuntimeError("cannot save") from inner
    except RuntimeError as outer:
        assert failed_write(outer, tmp_path).filename == str(tmp_path / "a" / "f")
    assert failed_write(OSError(errno.EPERM, "Operation not permitted"), tmp_path / "x").filename == str(tmp_path / "x")


def test_what_is_not_a_path_problem_passes_through_unchanged(tmp_path):
    for exc in (ValueError("a bad value"), InvalidConfig("train.lr", "got 0", "> 0")):
        with pytest.raises(type(exc)) as caught, writing(tmp_path / "f"):
            raise exc
        assert caught.value is exc
    assert not list(tmp_path.iterdir())  # the check of the path left nothing


def test_the_path_itself_says_why_when_the_error_does_not(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert refused_write(blocker / "below" / "x.pt").errno == errno.ENOTDIR
    assert refused_write(tmp_path / "new" / "x.pt") is None and refused_write(blocker) is None
    failed = failed_write(RuntimeError("unable to open database file"), blocker / "optuna.db")
    assert (failed.errno, failed.filename) == (errno.ENOTDIR, str(blocker / "optuna.db"))


def test_a_rename_names_its_target_and_a_mover_given_to_writing_wins(tmp_path):
    renamed = IsADirectoryError(errno.EISDIR, "Is a directory", str(tmp_path / ".summary.json.x.tmp"), None,
                                str(tmp_path / "summary.json"))
    assert failed_path(renamed, None) == tmp_path / "summary.json"
    with pytest.raises(OSError) as caught, writing(tmp_path / "optuna.db", moved_by="hydra.sweeper.storage"):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    assert unwritable_text(caught.value, tmp_path, "hydra.sweep.dir") == (
        "hydra.sweeper.storage", f"cannot write '{tmp_path / 'optuna.db'}': a read-only file system",
        "a path this user can create and write; hydra.sweeper.storage moves it")
