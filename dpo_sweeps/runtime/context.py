"""What every rank knows about its run beyond the config: a record of the bottom layer.

The Hydra task (dpo_sweeps/app.py) makes it; the ranks, the trainer and the run directory's writers read
it. It imports nothing of the project, so no module that needs it has to import the task's modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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
    attempt: str = ""
    started_at: float = 0.0  # time.time() when this attempt's Hydra task began (summary.json's cost fields)
    # The run's .hydra/ files (rundir/hydra_record.py), written by the job that takes the run directory's lock.
    hydra_record: dict[str, str] = field(default_factory=dict)
