"""The paths a run writes, and a failed write as one line naming the path and what moves it.

A run writes its run directory (`hydra.run.dir`; a sweep's runs under `hydra.sweep.dir`), its caches
(`$DPO_SWEEPS_CACHE`: a cache that cannot be written is skipped with a warning, never a failed run)
and temporary files (`$TMPDIR`). A write that fails there (a file where a folder must be, no
permission, a read-only or full file system) ends the command with one line: the path, the
problem, and the setting or environment variable that puts it elsewhere.

A full disk is often reported by write() or close(), whose OSError names no file: the run's writes go
through `writing(path)`, which names it, and an error that still names none is the run directory's.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
# Problems only a write has: an error that names no file is still one of the path written.
WRITE_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


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


@contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """Around a write of `path`: an OSError that names no file (ENOSPC from write() or close(), EDQUOT,
    EROFS) is raised again naming `path`, so it reads as every other failed write."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc


def is_path_error(exc: BaseException, within: Path | None = None) -> bool:
    """A write that failed for its path (a folder's place, permissions, a read-only or full file system);
    `within`: of a path under that folder (one that names no file counts as there)."""
    if not (isinstance(exc, OSError) and exc.errno in PROBLEMS
            and (exc.filename is not None or exc.errno in WRITE_ONLY)):
        return False
    return within is None or _under(failed_path(exc, Path(within)), Path(within))


def failed_path(exc: OSError, run_dir: Path | None) -> Path | None:
    """The path `exc` names; one that names none failed in `run_dir` (the run's writes name theirs)."""
    return Path(os.fsdecode(exc.filename)) if exc.filename is not None else run_dir


def unwritable_text(exc: OSError, run_dir: Path | None, setting: str) -> tuple[str, str, str]:
    """(what moves it, the problem, what is accepted) of a failed write of `exc`'s path."""
    path = failed_path(exc, run_dir)
    mover = mover_of(path, run_dir, setting) if path is not None else setting
    where = f"'{path}'" if path is not None else "the run directory"
    room = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return (mover.removeprefix("the ").removesuffix(" environment variable"),
            f"cannot write {where}: {PROBLEMS.get(exc.errno, exc.strerror)}",
            f"{'free space there, or a path with room' if room else 'a path this user can create and write'}; "
            f"{mover} moves it")


class UnwritablePath(InvalidConfig):
    """A path the run must write cannot be written: the job is refused in one line."""


def unwritable_path(exc: OSError, run_dir: Path | None, setting: str) -> UnwritablePath:
    """The one-line refusal for a failed write of exc.filename (or, naming none, in `run_dir`)."""
    return UnwritablePath(*unwritable_text(exc, run_dir, setting))


def failed_write_message(exc: BaseException, message: str, run_dir: Path, setting: str) -> str:
    """A run's failure `message` for a write that failed during the run (a full disk, mostly): the
    path, the problem and what moves it. `exc`: a path error, or one already naming its path (DiskFull)."""
    if is_path_error(exc, within=run_dir):
        _, problem, accepted = unwritable_text(exc, run_dir, setting)
        return f"{problem} ({accepted})"
    if str(run_dir) not in message:
        message += f" [run directory {run_dir}]"
    return message if "moves it" in message else f"{message}; {mover_of(run_dir, run_dir, setting)} moves it"

