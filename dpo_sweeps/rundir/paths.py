"""The paths a run writes, and a failed write as one line naming the path and what moves it.

A run writes its run directory (`hydra.run.dir`; a sweep's runs under `hydra.sweep.dir`), its caches
(`$DPO_SWEEPS_CACHE`: a cache that cannot be written is skipped with a warning, never a failed run)
and temporary files (`$TMPDIR`). A write that fails there (a file where a folder must be, no
permission, a read-only or full file system) ends the command with one line: the path, the
problem, and the setting or environment variable that puts it elsewhere.

A full disk is often reported by write() or close(), whose OSError names no file, and libraries report
a failed write in their own types (torch.save a RuntimeError, safetensors a SafetensorError, tokenizers
a bare Exception, sqlite an OperationalError, torch.distributed.checkpoint a CheckpointException): the
run's writes go through `writing(path)`, which raises every such failure again as an OSError naming the
path (`failed_write`), marked as a write wherever it is (a cache, a study's storage), and an OSError
that still names none is the run directory's.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dpo_sweeps.errors import InvalidConfig

# In a sweep directory: the staged search's answer (launchers/find_best.py writes it, the report reads it).
FIND_BEST = "find_best.json"
# The trained policy in Hugging Face format (or a PEFT adapter folder), and with train.save_merged the
# adapters merged into the base: what model.init_from reads from an earlier run.
SAVED_MODEL_DIR = "model"
MERGED_MODEL_DIR = "model_merged"
# An Optuna trial's link to its study, written by the sweeper into the trial's run directory (train/pruning.py).
TRIAL_FILE = "trial.json"

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


def saved_model_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / SAVED_MODEL_DIR


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


# The attribute `writing` sets on the OSError it raises: a failed write of the run's, and what moves its
# path ("" when the path tells: mover_of).
WRITE_MARK = "dpo_sweeps_moved_by"
# An errno in a library's message: Python's "[Errno 13]", Rust's "(os error 13)".
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]|\(os error (\d+)\)")


@contextmanager
def writing(path: Path | str, moved_by: str = "", libraries: bool = True) -> Iterator[None]:
    """Around a write of `path`: its failure, whatever raised it, is raised again as an OSError that names
    the path (`failed_write`) and is marked as a write, so it reads as every other failed write;
    `moved_by`: the setting that moves `path`, when its place does not tell (mover_of). `libraries=False`
    around more than writes (a whole sweep): only OSErrors, as a library's error there may be another's."""
    try:
        yield
    except BaseException as exc:  # torch.distributed.checkpoint's CheckpointException is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)) or not (libraries or isinstance(exc, OSError)):
            raise
        failed = failed_write(exc, path, moved_by)
        if failed is None:
            raise
        if failed is exc:
            raise
        raise failed from exc


def failed_write(exc: BaseException, path: Path | str, moved_by: str = "") -> OSError | None:
    """`exc`, raised while writing `path`, as the OSError of a path problem (PROBLEMS) naming the file
    (the one it named, else `path`) and marked as a write; None when it is not one. A library's own type
    counts when an OSError of the kind is in its chain, or its message gives the errno or the problem's
    words, or else when `path` cannot be written now (`refused_write`). The run's own errors (a refusal,
    a stop signal) are not write failures."""
    from hydra.errors import HydraException

    from dpo_sweeps.errors import RunFailure

    if isinstance(exc, (RunFailure, HydraException)):  # a refusal (InvalidSweep is Hydra's kind), a stop signal
        return None
    if isinstance(exc, OSError):
        if exc.errno is None:
            return None
        failed = exc if exc.filename is not None else OSError(exc.errno, exc.strerror, os.fspath(path))
    else:
        failed = _os_error_in(exc, path) or refused_write(path)
        if failed is None or failed.errno not in PROBLEMS:
            return None
    if not hasattr(failed, WRITE_MARK):  # an inner `writing` knew better
        setattr(failed, WRITE_MARK, moved_by)
    return failed


def _os_error_in(exc: BaseException, path: Path | str) -> OSError | None:
    """The path problem a library's exception reports: an OSError in its chain, or its message's errno or words."""
    seen: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in seen and len(seen) < 8:
        seen.append(link)
        if isinstance(link, OSError) and link.errno in PROBLEMS:
            return OSError(link.errno, link.strerror, os.fspath(path) if link.filename is None else link.filename,
                           None, link.filename2)
        link = link.__cause__ or link.__context__
    text = " ".join(str(e) for e in seen)
    for match in _ERRNO_IN_TEXT.finditer(text):
        code = int(match.group(1) or match.group(2))
        if code in PROBLEMS:
            return OSError(code, os.strerror(code), os.fspath(path))
    code = next((c for c in PROBLEMS if os.strerror(c).lower() in text.lower()), None)
    return OSError(code, os.strerror(code), os.fspath(path)) if code is not None else None


def refused_write(path: Path | str) -> OSError | None:
    """Why `path` cannot be written now, as an OSError naming it (None: it can). Its folder (or the nearest
    one above a path not made yet) gets a one-byte file, removed at once: writers make files beside the one
    they write (sqlite its journal, atomic writes their temporary file); an existing file is also opened to
    append, which changes nothing; a file above it is a file where a folder must be."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    while not os.path.lexists(folder) and folder.parent != folder:
        folder = folder.parent
    try:
        if not folder.is_dir():
            return OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), os.fspath(path))
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
        try:
            os.write(fd, b"\0")
        finally:
            os.close(fd)
            os.unlink(probe)
        if path.is_file():
            with open(path, "ab"):
                pass
    except OSError as exc:
        return OSError(exc.errno, exc.strerror, os.fspath(path)) if exc.errno in PROBLEMS else None
    return None


def is_path_error(exc: BaseException, within: Path | None = None) -> bool:
    """A write that failed for its path (a folder's place, permissions, a read-only or full file system);
    `within`: of a path under that folder (one that names no file counts as there), or a write `writing`
    reported, wherever it is (a cache, the study's storage)."""
    if not (isinstance(exc, OSError) and exc.errno in PROBLEMS
            and (exc.filename is not None or exc.errno in WRITE_ONLY)):
        return False
    return within is None or hasattr(exc, WRITE_MARK) or _under(failed_path(exc, Path(within)), Path(within))


def failed_path(exc: OSError, run_dir: Path | None) -> Path | None:
    """The path `exc` names (a rename's target: what an atomic write writes, not its temporary file); one
    that names none failed in `run_dir` (the run's writes name theirs)."""
    named = getattr(exc, "filename2", None) or exc.filename
    return Path(os.fsdecode(named)) if named is not None else run_dir


def unwritable_text(exc: OSError, run_dir: Path | None, setting: str) -> tuple[str, str, str]:
    """(what moves it, the problem, what is accepted) of a failed write of `exc`'s path."""
    path = failed_path(exc, run_dir)
    mover = getattr(exc, WRITE_MARK, "") or (mover_of(path, run_dir, setting) if path is not None else setting)
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


def remove_empty_run_dir(run_dir: Path | str) -> None:
    """Remove a run directory Hydra made that nothing was written to and, below the working directory,
    the folders above it Hydra made with it (`outputs/<date>/`) while they are empty. A folder that is
    not empty stays, whoever wrote it."""
    cwd = Path.cwd().resolve()
    folder = Path(os.path.abspath(run_dir))
    try:
        folder.rmdir()
    except OSError:  # not empty (or gone): the folders above are not ours to clean
        return
    folder = folder.parent
    while folder != cwd and _under(folder, cwd):
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent

