"""`python -m dpo_sweeps [overrides]`: one run; `-m` for a sweep (Hydra multirun). Stage 1 of the road from
the command to the step (docs/architecture.md): Hydra's main around the task function, `dpo_sweeps.task.run`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.errors import CompactHydraException

from dpo_sweeps.checks.schema_errors import group_refusal, one_line_message, removed_group_refusal, schema_refusal
from dpo_sweeps.config import config_dir
from dpo_sweeps.errors import RunFailure
from dpo_sweeps.redaction import redact_output
from dpo_sweeps.run_end import INTERRUPTED, error_line, finish
from dpo_sweeps.rundir.paths import failed_path, is_path_error, unwritable_path
from dpo_sweeps.runtime.startup import python_handles_ctrl_c
from dpo_sweeps.task import run

# Wrapped here, not decorated at the definition: submitit must pickle `run` by reference.
hydra_main = hydra.main(config_path=config_dir(), config_name="config", version_base="1.3")(run)

FULL_ERROR = "HYDRA_FULL_ERROR"


def main() -> None:
    """Hydra's main, with a key or value that does not fit the schema refused in one line naming it.

    Hydra reports errors itself unless HYDRA_FULL_ERROR is set; it is set here so the error reaches
    this function, which prints Hydra's compact errors as Hydra would and the schema's in one line.
    A user who sets HYDRA_FULL_ERROR=1 gets Hydra's full report as before.
    """
    python_handles_ctrl_c()  # the imports are done: a Ctrl-C is caught below as KeyboardInterrupt
    redact_output()  # Hydra's own lines list the overrides, which may hold a password
    removed = removed_group_refusal(sys.argv[1:])
    if removed is not None:  # before Hydra makes a run or sweep directory
        finish(error_line(removed))
    if os.environ.get(FULL_ERROR) == "1":
        hydra_main()
        return
    os.environ[FULL_ERROR] = "1"
    try:
        hydra_main()
    except KeyboardInterrupt:  # before the run's own handlers were installed (a run stops with its summary)
        finish(INTERRUPTED)
    except Exception as exc:
        refusal = schema_refusal(exc) or group_refusal(exc, sys.argv[1:])
        if refusal is None and is_path_error(exc):  # Hydra creating the run or sweep directory, multirun.yaml
            refusal = unwritable_path(exc, _output_dir(exc), "hydra.sweep.dir" if _multirun() else "hydra.run.dir")
        if refusal is None and not isinstance(exc, (CompactHydraException, RunFailure)):
            raise
        # Hydra's own errors span lines (options, search path); ours (a sweep's refusal lists its points) are kept.
        hydras = isinstance(exc, CompactHydraException) and type(exc).__module__.startswith("hydra.")
        finish(error_line(refusal or (one_line_message(exc) if hydras else exc)))
    finally:
        os.environ.pop(FULL_ERROR, None)


def _multirun() -> bool:
    return any(a in ("-m", "--multirun") for a in sys.argv[1:])


def _output_dir(exc: OSError) -> Path | None:
    """The run (or sweep) directory a failed write of Hydra's was in: the path it names, else Hydra's."""
    if exc.filename is not None:
        return failed_path(exc, None)
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    return Path(str(hydra_cfg.sweep.dir if _multirun() else hydra_cfg.runtime.output_dir))



if __name__ == "__main__":
    main()
