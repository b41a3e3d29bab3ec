"""The paths a run writes, and a failed write as one line naming the path and what moves it.

A run writes its run directory (`hydra.run.dir`; a sweep's runs under `hydra.sweep.dir`), its caches
(`$DPO_SWEEPS_CACHE`: a cache that cannot be written is skipped with a warning, never a failed run)
and temporary files (`$TMPDIR`). A write that fails there (a file where a folder must be, no
permission, a read-only or full file system) ends the command with one line: the path, the
problem, and the setting or environment variable that puts it elsewhere.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from dpo_sweeps.errors import InvalidConfig

# In a sweep directory: the staged search's answer (launchers/find_best.py writes it, the report reads it).
FIND_BEST = "find_best.json"

PROBLEMS = {
    errno.EEXIST: "a file is there, where a folder must be",
    errno.ENOTDIR: "a part of it is a file, where a folder must be",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "a read-only file system",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EISDIR: "a folder is there, where a file must be",
    errno.ENAMETOOLONG: "the name is too long",
}


def cache_root() -> Path:
    """$DPO_SWEEPS_CACHE, default ~/.cache/dpo_sweeps (the tokenizer and reference log-prob caches)."""
    return Path(os.environ.get("DPO_SWEEPS_CACHE", Path.home() / ".cache" / "dpo_sweeps"))


def _under(path: Path, root: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
    except ValueError:
        return False
    return True


def mover_of(path: Path, run_dir: Path | None, setting: str) -> str:
    """What puts `path` elsewhere: `setting` (the run or sweep directory's) for the run's own files."""
    if run_dir is not None and _under(path, run_dir):
        return setting
    if _under(path, cache_root()):
        return "the DPO_SWEEPS_CACHE environment variable"
    if _under(path, Path(tempfile.gettempdir())):
        return "the TMPDIR environment variable"
    return setting


def is_path_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in PROBLEMS and exc.filename is not None


def unwritable_path(exc: OSError, run_dir: Path | None, setting: str) -> InvalidConfig:
    """The one-line refusal for a failed write of exc.filename."""
    path = Path(os.fsdecode(exc.filename))
    mover = mover_of(path, run_dir, setting)
    return InvalidConfig(mover.removeprefix("the ").removesuffix(" environment variable"),
                         f"cannot write '{path}': {PROBLEMS.get(exc.errno, exc.strerror)}",
                         f"a path this user can create and write; {mover} moves it")

