"""What every rank knows about its run beyond the config: a record of the bottom layer.

The Hydra task (dpo_sweeps/app.py) makes it; the ranks, the trainer and the run directory's writers read
it. It imports nothing of the project, so no module that needs it has to import the task's modules.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# The attempt id a launcher gives the job it starts (launchers/job_side.py), so that it knows which
# summary.json is this attempt's (rundir/summary.py read_summary); a run started otherwise makes its own.
ATTEMPT_ENV = "DPO_SWEEPS_ATTEMPT"


def new_attempt() -> str:
    """A fresh attempt id: whoever starts an attempt makes one and tells the run (ATTEMPT_ENV)."""
    return uuid.uuid4().hex


def attempt_id() -> str:
    """This attempt's id: the one its launcher gave it, else a new one."""
    return os.environ.get(ATTEMPT_ENV) or new_attempt()


@dataclass
class RunContext:
    """What every rank needs to know about the run, beyond the config."""

    run_dir: Path
    config: dict  # the resolved config, plain containers
    overrides: list[str]
    base_dir: Path  # where relative data paths resolve (the user's working directory)
    dir_setting: str = "hydra.run.dir"  # what moves run_dir (hydra.sweep.dir for a sweep's job), for messages
    run_name: str = "run"
    group: str = "run"
    sweep_dir: Path | None = None
    """The sweep the run is a job of (hydra.sweep.dir: a find_best's root, not its stage's folder); None
    for a single run. The trackers' one view of the sweep (an MLflow parent run) is made for it."""
    attempt: str = ""
    """Whoever started the attempt named it (attempt_id); summary.json's `attempt`."""
    started_at: float = 0.0  # time.time() when this attempt's Hydra task began (summary.json's cost fields)
    # The run's .hydra/ files (rundir/hydra_record.py), written by the job that takes the run directory's lock.
    hydra_record: dict[str, str] = field(default_factory=dict)
