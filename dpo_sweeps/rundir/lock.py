"""One job per run directory: an exclusive lock on `<run dir>/.lock` while the run is live.

The process that owns the run's outputs holds it: the launcher process of local ranks, or rank 0
under torchrun and multi-task submitit jobs. A second job on the same directory is refused before it
writes anything there: `.hydra/` too is written only by the lock's holder (rundir/hydra_record.py).

The lock is `flock`: the kernel releases it when its holder dies, however it dies, so a lock left
by a killed job is simply taken over. Where the filesystem has no flock, the lock file itself is
the lock (created with O_EXCL), and one whose pid is dead on this host is taken over.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.rundir.paths import writing

LOCK = ".lock"
_NO_FLOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class RunDirInUse(InvalidConfig):
    """Another live job writes this run directory."""

    def __init__(self, run_dir: Path, holder: dict):
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
        if holder.get("slurm_job_id"):
            who += f" (SLURM job {holder['slurm_job_id']})"
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["time"])) if "time" in holder else "?"
        super().__init__("hydra.run.dir", f"{run_dir} is being written by {who} since {since}",
                         "a directory no live job writes: wait for that job, or choose another hydra.run.dir")


def _holder_record() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def _read_holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunDirLock:
    """Held from `acquire()` until `release()` or the holder's death."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self._fd: int | None = None
        self.created = False  # the lock file is this holder's own (none was there)

    def acquire(self) -> RunDirLock:
        """Take the lock or raise RunDirInUse; never waits."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd, created = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            fd, created = os.open(self.path, os.O_RDWR), False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirInUse(self.run_dir, _read_holder(self.path)) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_FLOCK:
                raise
            return self._acquire_by_pid()
        try:
            with writing(self.path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(_holder_record()).encode(), 0)
        except OSError:  # a full disk: leave no lock file of ours behind (the job is refused)
            if created:
                self.path.unlink(missing_ok=True)
            os.close(fd)
            raise
        self._fd, self.created = fd, created
        return self

    def _acquire_by_pid(self) -> RunDirLock:
        holder = _read_holder(self.path)
        if holder.get("pid") and holder.get("pid") != os.getpid():
            same_host = holder.get("host") == socket.gethostname()
            if not same_host or _pid_alive(int(holder["pid"])):
                raise RunDirInUse(self.run_dir, holder)
        # free, or stale (its holder died on this host): take it over atomically
        tmp = self.path.with_name(f"{LOCK}.{os.getpid()}")
        try:
            with writing(tmp):
                tmp.write_text(json.dumps(_holder_record()))
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.path)
        return self

    def release(self, refused: bool = False) -> None:
        """`refused`: the job was refused before it wrote anything here (a full disk): a lock file it
        created goes too."""
        if refused and self.created:
            self.path.unlink(missing_ok=True)
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        elif _read_holder(self.path).get("pid") == os.getpid():
            self.path.write_text("")
