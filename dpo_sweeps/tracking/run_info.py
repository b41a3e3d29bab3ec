"""What every tracking backend is told about a run, read once from the run's config and directory.

The sweep is the unit a user compares runs in: W&B's group, MLflow's parent run, Trackio's project,
TensorBoard's `--logdir`. `sweep_group` names it; `job_type_of` says what a run is in it (probe, trial or
train), so find_best's stages and an Optuna study's trials read apart.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpo_sweeps.config.schema import Config
from dpo_sweeps.redaction import redact_text, scrub_secrets
from dpo_sweeps.rundir.paths import TRIAL_FILE  # the Optuna sweeper writes it into every trial's run

# Hydra's default sweep directory, multirun/DATE/TIME: the time alone does not name the sweep.
_DATE, _TIME = re.compile(r"\d{4}-\d{2}-\d{2}"), re.compile(r"\d{2}-\d{2}-\d{2}")


def sweep_group(sweep_dir: Path) -> str:
    """The name of a sweep's runs' group: `DATE/TIME` for Hydra's default multirun/DATE/TIME, else the
    sweep directory's name (`multirun/optuna_dpo` -> `optuna_dpo`)."""
    sweep_dir = Path(sweep_dir)
    if _TIME.fullmatch(sweep_dir.name) and _DATE.fullmatch(sweep_dir.parent.name):
        return f"{sweep_dir.parent.name}/{sweep_dir.name}"
    return sweep_dir.name


def job_type_of(cfg: Config, run_dir: Path) -> str:
    """What the run is: a `probe` (probe.steps > 0), an Optuna `trial`, or a `train` run."""
    if cfg.probe.steps > 0:
        return "probe"
    return "trial" if (Path(run_dir) / TRIAL_FILE).exists() else "train"


def trial_number_of(run_dir: Path) -> int | None:
    """The Optuna trial number of a trial's run (its trial.json), else None."""
    path = Path(run_dir) / TRIAL_FILE
    try:
        return int(json.loads(path.read_text())["trial_number"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config tree as dotted keys (`train.lr`), the way trackers list parameters; lists stay values."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


@dataclass(frozen=True)
class RunInfo:
    """One run as the trackers see it."""

    run_dir: Path
    name: str
    """The run's name: `SWEEP/NUM` for a sweep's job, the run directory's name for a single run."""
    sweep: str
    """The sweep's name (sweep_group); a single run is its own."""
    sweep_dir: Path | None
    """The sweep directory the run is a job of (a find_best's root, whose stages' folders hold the jobs);
    None for a single run."""
    stage: str
    """probe, trial or train (job_type_of)."""
    trial_number: int | None
    config: dict[str, Any]
    """The resolved config, secrets scrubbed (plain containers)."""
    plan_label: str | None
    """The parallel plan's label (`FULL_SHARD fp32`), as summary.json's plan says it."""
    uid: str = ""
    """The run's identity in every tracker, made at its first start and kept in tracking.json: a resumed run
    and an upload find its tracker run by it; a run started over in an emptied directory gets a new one."""

    @property
    def params(self) -> dict[str, Any]:
        return flatten(self.config)

    @property
    def tags(self) -> dict[str, str]:
        """What every backend that has tags records: which sweep, what stage, which trial, which plan."""
        tags = {"sweep": self.sweep, "stage": self.stage}
        if self.trial_number is not None:
            tags["trial"] = str(self.trial_number)
        if self.plan_label:
            tags["plan"] = self.plan_label
        return {key: redact_text(value) for key, value in tags.items()}

    @classmethod
    def of(cls, cfg: Config, *, run_dir: Path, name: str, group: str, sweep_dir: Path | None, config: dict,
           plan_label: str | None) -> RunInfo:
        """A running job's: a sweep's job is named `GROUP/NUM` (app.py), a single run (`sweep_dir` None)
        after its directory."""
        run_dir = Path(run_dir)
        return cls(run_dir=run_dir, name=name, sweep=group, sweep_dir=None if sweep_dir is None else Path(sweep_dir),
                   stage=job_type_of(cfg, run_dir), trial_number=trial_number_of(run_dir),
                   config=scrub_secrets(config), plan_label=plan_label)
