"""The run's log file (`<run dir>/<job name>.log`, Hydra's job logging): a failed write is one warning.

Python's logging prints a "--- Logging error ---" block with a traceback for each record a handler
cannot write (on a full disk: each log line), and a file opened at its first record (`delay: true`)
raises from the logging call itself when it cannot be created. conf/config.yaml makes this class
Hydra's `file` handler: the first write that fails prints one line naming the file, the problem and
what moves it, and the log goes on to the screen only. Other errors (a record that does not format)
are reported as logging reports them.
"""

from __future__ import annotations

import logging
import os

from dpo_sweeps.errors import say
from dpo_sweeps.redaction import environment_secrets, redact_text


class RunLogFile(logging.FileHandler):
    """logging.FileHandler that stops, with one warning, at the first write its file system refuses, and
    writes no secret (dpo_sweeps/redaction.py)."""

    stopped = False

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record), environment_secrets())

    def emit(self, record: logging.LogRecord) -> None:
        if self.stopped:
            return
        try:
            if self.stream is None and (self.mode != "w" or not self._closed):
                self.stream = self._open()
        except OSError as exc:
            self._stop(exc)
            return
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self._stop(exc)
        else:
            super().handleError(record)

    def _stop(self, exc: OSError) -> None:
        from dpo_sweeps.rundir.paths import unwritable_text

        self.stopped = True
        try:
            if self.stream is not None:
                self.stream.close()  # its buffered text cannot be written either
        except OSError:
            pass
        self.stream = None
        if exc.filename is None:
            exc = OSError(exc.errno, exc.strerror, self.baseFilename)
        run_dir = os.path.dirname(self.baseFilename)
        setting, problem, accepted = unwritable_text(exc, run_dir, _dir_setting())
        say(f"warning: the run's log file: {problem} ({accepted}); the log goes on to the screen only")


def _dir_setting() -> str:
    """What moves the log file: the run's directory setting (Hydra's, known in the job's process)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return "hydra.sweep.dir" if HydraConfig.get().mode == RunMode.MULTIRUN else "hydra.run.dir"
    except Exception:  # no Hydra job here (a test, a library user's own logging)
        return "hydra.run.dir"
