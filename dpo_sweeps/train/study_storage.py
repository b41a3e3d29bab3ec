"""Where an Optuna study lives: `hydra.sweeper.storage`, opened the same way by the sweeper, its trials and the report.

Two kinds of storage, both shared by every process that names them:
- an RDB URL (`sqlite:///PATH`, `postgresql://...`, `mysql://...`): Optuna's RDBStorage. A relative
  sqlite path is made absolute, because trial processes may start in another working directory;
- `journal:PATH`: an append-only journal file (Optuna's JournalFileBackend), for several sweep
  processes on a shared filesystem (SLURM jobs on NFS) where sqlite's locking is not to be trusted.

An RDB written by an older Optuna (2.10's schema, say) is refused in one line: Optuna's own upgrade
rewrites it for good, so it is the user's call, not ours.

A URL with a password (`postgresql://alice:PASSWORD@db/optuna`) works, and no file holds the password:
the sweeper writes the URL redacted wherever it writes it (multirun.yaml, the jobs' files, trial.json)
and puts the whole URL in its own environment (STORAGE_ENV), which every job it launches inherits (a
local process, or an sbatch job: sbatch passes the submitting environment on); `open_storage` of the
redacted URL takes the password from there.
"""

from __future__ import annotations

import os
from typing import Any

from dpo_sweeps.redaction import REDACTED, redact_text

JOURNAL = "journal:"
# The trial user attribute the Optuna sweeper records for the fit check: estimated peak memory minus the
# device's memory, in GiB (> 0: predicted not to fit, so the trial was skipped and is infeasible).
MEMORY_CONSTRAINT = "constraint/peak_memory_over_limit_gib"
SQLITE = "sqlite:///"
STORAGE_ENV = "DPO_SWEEPS_STUDY_STORAGE"


class StorageRefused(Exception):
    """A storage that cannot be opened as given; the message is one line naming the setting."""


def storage_spec(storage: str) -> str:
    """The storage setting with relative file paths made absolute (what trial processes are given)."""
    for prefix in (JOURNAL, SQLITE):
        if storage.startswith(prefix) and not storage[len(prefix):].startswith("/"):
            return prefix + os.path.abspath(storage[len(prefix):])
    return storage


def storage_file(storage: str) -> str | None:
    """The file a sqlite or journal storage writes (None for a database server's)."""
    spec = storage_spec(storage)
    for prefix in (JOURNAL, SQLITE):
        if spec.startswith(prefix):
            return spec[len(prefix):].split("?", 1)[0]
    return None


def share_storage(storage: str) -> None:
    """A storage with a secret (files hold it redacted): the whole URL in this process's environment, for
    the jobs it launches (`with_password`)."""
    if redact_text(storage) != storage:
        os.environ[STORAGE_ENV] = storage


def with_password(storage: str, setting: str) -> str:
    """A storage redacted by `share_storage`, whole again from the environment."""
    if REDACTED not in storage:
        return storage
    whole = os.environ.get(STORAGE_ENV)
    if whole and redact_text(whole) == storage:
        return whole
    raise StorageRefused(f"{setting}: {storage} has its credential redacted and {STORAGE_ENV} does not hold it "
                         f"(accepted: {STORAGE_ENV}=<the URL with its password> in the environment, as the sweep "
                         "sets it for its own jobs)")


def open_storage(storage: str, setting: str = "hydra.sweeper.storage") -> Any:
    """The Optuna storage object for `storage` (see the module docstring); raises StorageRefused."""
    import optuna

    spec = storage_spec(with_password(storage, setting))
    if spec.startswith(JOURNAL):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = spec[len(JOURNAL):]
        if not os.path.isdir(os.path.dirname(path)):
            raise StorageRefused(f"{setting}: {storage}: the folder {os.path.dirname(path)} does not exist "
                                 "(accepted: journal:PATH in an existing folder)")
        return JournalStorage(JournalFileBackend(path))
    if "://" not in spec:
        raise StorageRefused(f"{setting}: {storage!r} is not a storage (accepted: an RDB URL such as "
                             "sqlite:///PATH/optuna.db, or journal:PATH for a journal file)")
    try:  # first without creating tables: an older schema is refused before anything is added to it
        probe = optuna.storages.RDBStorage(spec, skip_compatibility_check=True, skip_table_creation=True)
    except optuna.exceptions.StorageInternalError:  # an empty database: Optuna creates the current schema
        probe = None
    except Exception as exc:  # a bad URL, a missing driver, a database that is not reachable
        raise StorageRefused(f"{setting}: {storage}: {str(exc).splitlines()[0]} (accepted: an RDB URL Optuna "
                             "can open, or journal:PATH)") from None
    if probe is not None:
        current, head = probe.get_current_version(), probe.get_head_version()
        probe.engine.dispose()
        if current != head:
            raise StorageRefused(
                f"{setting}: {storage} holds a study written by an older optuna (schema {current}; optuna "
                f"{optuna.__version__} needs {head}): `optuna storage upgrade --storage {spec}` converts it, one-way "
                "(the older optuna cannot open it afterwards); or use a new storage or hydra.sweep.dir")
    return optuna.storages.RDBStorage(spec)
