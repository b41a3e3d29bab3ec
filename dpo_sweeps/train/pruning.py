"""Optuna pruning, the trial's side: report each evaluation to the study and stop when the pruner says so.

The Optuna sweeper (launchers/optuna_sweeper.py) writes `trial.json` into a trial's run directory before
it launches the job: the study's storage and name, the trial, the objective and the pruner. A run that
finds it reports the objective after every evaluation (`train.eval_every`) as the trial's intermediate
value at that step, and asks the pruner; a pruned run stops at that evaluation and ends with summary
status `pruned`. Only rank 0 talks to the study; every rank stops together.

Optuna is imported only by runs that have a trial.json.
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.rundir.paths import TRIAL_FILE

# hydra.sweeper.pruner -> the optuna.pruners class it makes (settings: hydra.sweeper.pruner_settings).
PRUNERS = {
    "none": None,
    "median": "MedianPruner",
    "successive_halving": "SuccessiveHalvingPruner",
    "hyperband": "HyperbandPruner",
}


def make_pruner(name: str, settings: dict[str, Any] | None = None) -> Any:
    """The optuna pruner for `hydra.sweeper.pruner` and its settings (None for `none`)."""
    if name not in PRUNERS:
        raise InvalidConfig("hydra.sweeper.pruner", f"unknown pruner {name!r}", ", ".join(PRUNERS))
    settings = dict(settings or {})
    if PRUNERS[name] is None:
        if settings:
            raise InvalidConfig("hydra.sweeper.pruner_settings", f"{sorted(settings)} given with pruner=none",
                                "no settings, or a pruner: " + ", ".join(p for p in PRUNERS if p != "none"))
        return None
    import optuna

    cls = getattr(optuna.pruners, PRUNERS[name])
    accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(settings) - set(accepted))
    if unknown:
        raise InvalidConfig("hydra.sweeper.pruner_settings", f"{', '.join(unknown)} is not a setting of {name}",
                            ", ".join(accepted))
    try:
        return cls(**settings)
    except (TypeError, ValueError) as exc:
        raise InvalidConfig("hydra.sweeper.pruner_settings", str(exc), f"the settings of optuna's {cls.__name__}") from None


@dataclass
class TrialLink:
    """What trial.json holds: where the study is, which trial this run is, what to report.

    Every Optuna trial has one (it also tells wandb the run is a trial); only those with a pruner report."""

    storage: str | None  # dpo_sweeps.train.study_storage: an RDB URL or journal:PATH (None: in memory)
    study_name: str
    trial_number: int
    objective: str
    pruner: str
    pruner_settings: dict[str, Any]

    def write(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / TRIAL_FILE).write_text(json.dumps(self.__dict__, indent=1) + "\n")

    @classmethod
    def read(cls, run_dir: Path) -> TrialLink | None:
        path = Path(run_dir) / TRIAL_FILE
        if not path.exists():
            return None
        fields = json.loads(path.read_text())
        return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})


class TrialReporter:
    """Rank 0's connection to the study: `report(eval_metrics, step)` says whether to stop."""

    def __init__(self, link: TrialLink, run_dir: Path | None = None):
        import optuna

        from dpo_sweeps.train.study_storage import open_storage

        self.link = link
        self.sweep_dir = None if run_dir is None else Path(run_dir).parent  # a trial runs in <sweep dir>/N
        with self.writing():
            storage = open_storage(link.storage, setting="trial.json storage")
            study = optuna.load_study(study_name=link.study_name, storage=storage,
                                      pruner=make_pruner(link.pruner, link.pruner_settings))
            # The storage's id of trial N of this study (the sweeper knows the trial by its number).
            trial_id = storage.get_trial_id_from_study_id_trial_number(
                storage.get_study_id_from_name(link.study_name), link.trial_number)
        self.trial = optuna.trial.Trial(study, trial_id)
        self.pruned_at: tuple[int, float] | None = None

    def writing(self) -> Any:
        """`writing` the study's storage file (sqlite and journal storages), so that a failed write there
        names it and what moves it: hydra.sweep.dir in the sweep directory (the default), else
        hydra.sweeper.storage (as the sweeper says it)."""
        import contextlib

        from dpo_sweeps.rundir.paths import writing
        from dpo_sweeps.train.study_storage import storage_file

        file = storage_file(self.link.storage) if self.link.storage else None
        if file is None:
            return contextlib.nullcontext()
        inside = self.sweep_dir is not None and Path(file).resolve().is_relative_to(self.sweep_dir.resolve())
        return writing(file, moved_by="hydra.sweep.dir" if inside else "hydra.sweeper.storage")

    def report(self, eval_metrics: dict[str, Any], step: int) -> bool:
        """Record the objective at `step`; True when the pruner stops this trial."""
        value = eval_metrics.get(self.link.objective)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return False  # nothing to judge the trial by; the sweeper tells the final state
        with self.writing():
            self.trial.report(float(value), step)
        if self.trial.should_prune():
            self.pruned_at = (step, float(value))
            return True
        return False


def pruning_link(run_dir: Path) -> TrialLink | None:
    """The trial this run reports to, when it is an Optuna trial with a pruner (every rank reads it)."""
    link = TrialLink.read(run_dir)
    return link if link is not None and PRUNERS.get(link.pruner) is not None and link.storage else None
