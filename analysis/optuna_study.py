"""Read an Optuna sweep: its study's trials from `optuna.db`, its `optimization_results.yaml`.

The Optuna sweeper (launchers/optuna_sweeper.py) keeps the study in `sqlite:///<sweep_dir>/optuna.db`
by default, and writes `optimization_results.yaml` (`best_params`/`best_value`, or Pareto `solutions`
when multi-objective) once the sweep ends. The database is copied with SQLite's backup API before
Optuna opens it, so a sweep still writing to it is neither locked nor touched. A database an older
Optuna wrote is not opened (dpo_sweeps/train/study_storage.py says why, in one line).
`study_figures` draws Optuna's own figures of a study (optimization history, parameter importances).
"""

from __future__ import annotations

import math
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dpo_sweeps.analysis import sweep_definition
from dpo_sweeps.analysis.ranking import dominates
from dpo_sweeps.analysis.runs import SUMMARY_METRICS, Run
from dpo_sweeps.train.study_storage import MEMORY_CONSTRAINT


@dataclass
class Trial:
    number: int
    # Optuna's TrialState name: COMPLETE, FAIL, RUNNING, WAITING, PRUNED.
    state: str
    values: tuple[float, ...] | None
    params: dict[str, Any]
    # The best trial (one objective) or a trial on the Pareto front (several).
    best: bool = False
    # Name of the run directory that ran this trial, when one matches its params.
    run: str | None = None
    # Step -> the objective the trial reported there (each evaluation, when the sweep had a pruner).
    intermediate: dict[int, float] = field(default_factory=dict)
    # False for a point the fit check skipped (predicted out of memory): infeasible, never best.
    feasible: bool = True


@dataclass
class Study:
    sweep: Path
    name: str
    # "maximize" or "minimize", one per objective.
    directions: list[str] = field(default_factory=list)
    trials: list[Trial] = field(default_factory=list)
    # What each objective is: the summary metric its values equal, else "objective i".
    objectives: list[str] = field(default_factory=list)
    # optimization_results.yaml as written by the sweeper (None while the sweep runs).
    results: dict[str, Any] | None = None
    # Why the study database could not be read.
    problem: str | None = None
    # Optuna's own records of the finished trials (optuna.trial.FrozenTrial), for Optuna's figures.
    frozen: list[Any] = field(default_factory=list, repr=False)

    @property
    def best_trials(self) -> list[Trial]:
        return [t for t in self.trials if t.best]


def mark_best(trials: list[Trial], directions: list[str]) -> None:
    """Flag the best complete trial, or the Pareto front of the complete trials."""
    signs = tuple(1 if d == "maximize" else -1 for d in directions)
    complete = [t for t in trials if t.state == "COMPLETE" and t.feasible and t.values
                and all(map(math.isfinite, t.values))]
    if not complete:
        return
    if len(signs) == 1:
        max(complete, key=lambda t: signs[0] * t.values[0]).best = True
        return
    for trial in complete:
        trial.best = not any(dominates(o.values, trial.values, signs) for o in complete)


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return str(a) == str(b)


def match_runs(trials: list[Trial], runs: list[Run]) -> None:
    """Name the run of each trial: the run whose overrides hold the trial's params.

    Hydra numbers a sweep's jobs from 0 like Optuna numbers a fresh study's trials, so among
    runs with equal params the one in job folder `<trial number>` wins.
    """
    taken: set[str] = set()
    for trial in trials:
        candidates = [run for run in runs if run.name not in taken and trial.params and all(
            k in run.settings and _same_value(run.settings[k], v) for k, v in trial.params.items())]
        if candidates:
            chosen = next((r for r in candidates if r.path.name == str(trial.number)), candidates[0])
            trial.run = chosen.name
            taken.add(chosen.name)


def name_objectives(study: Study, runs: list[Run]) -> list[str]:
    """For each objective, the summary metric that every matched trial's value equals."""
    by_name = {r.name: r for r in runs}
    pairs = [(t, by_name[t.run]) for t in study.trials
             if t.state == "COMPLETE" and t.values and t.run in by_name and by_name[t.run].status == "completed"]
    names = []
    for index in range(len(study.directions)):
        found = next((metric for metric in SUMMARY_METRICS if pairs and all(
            _same_value(t.values[index], r.metric(metric)) for t, r in pairs)), None)
        names.append(found or f"objective {index}")
    return names


def _snapshot(db: Path, copy: Path) -> None:
    source = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    target = sqlite3.connect(copy)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


def _read_db(db: Path, sweep: Path) -> list[Study]:
    import optuna  # imported here: slow to import, and only Optuna sweeps need it

    from dpo_sweeps.train.study_storage import StorageRefused, open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "optuna.db"
        _snapshot(db, copy)
        try:
            storage = open_storage(f"sqlite:///{copy}", setting="optuna.db")
        except StorageRefused as refused:
            return [Study(sweep, db.name, problem=str(refused).replace(f"sqlite:///{copy}", f"sqlite:///{db}"))]
        try:
            return _read_storage(storage, sweep)
        finally:
            storage.engine.dispose()  # close the copy before its folder goes


def _read_storage(storage: Any, sweep: Path) -> list[Study]:
    """Every study in an open Optuna storage."""
    import optuna

    studies = []
    for summary in optuna.get_all_study_summaries(storage):
        loaded = optuna.load_study(study_name=summary.study_name, storage=storage)
        study = Study(sweep, loaded.study_name, [d.name.lower() for d in loaded.directions])
        for frozen in loaded.get_trials(deepcopy=True):
            values = tuple(frozen.values) if frozen.values is not None else None
            study.trials.append(Trial(frozen.number, frozen.state.name, values, dict(frozen.params),
                                      intermediate=dict(sorted(frozen.intermediate_values.items())),
                                      feasible=frozen.user_attrs.get(MEMORY_CONSTRAINT, 0.0) <= 0.0))
            if frozen.state.is_finished():
                study.frozen.append(frozen)
        studies.append(study)
    return studies


def journal_of(sweep: Path) -> Path | None:
    """The journal file of a sweep whose hydra.sweeper.storage is `journal:PATH` (None: another storage)."""
    storage = str(sweep_definition.sweeper_config(sweep).get("storage") or "")
    if not storage.startswith("journal:"):
        return None
    path = Path(storage[len("journal:"):].replace("${hydra.sweep.dir}", str(sweep)))
    return path if path.is_file() else None


def load_studies(sweep_dirs: list[Path], runs: list[Run]) -> list[Study]:
    """The Optuna studies of the sweeps that have `optuna.db`, a journal storage or `optimization_results.yaml`."""
    studies: list[Study] = []
    for sweep in sweep_dirs:
        results_path, db, journal = sweep / "optimization_results.yaml", sweep / "optuna.db", journal_of(sweep)
        results = yaml.safe_load(results_path.read_text(encoding="utf-8")) if results_path.is_file() else None
        if not db.is_file() and journal is None and results is None:
            continue
        sweep_runs = [r for r in runs if r.sweep == sweep]
        found: list[Study] = []
        if db.is_file():
            try:
                found = _read_db(db, sweep)
            except Exception as error:  # a schema from another Optuna version, a torn file
                found = [Study(sweep, db.name, problem=f"{db}: could not be read by optuna ({error})")]
        elif journal is not None:
            from dpo_sweeps.train.study_storage import open_storage

            try:
                found = _read_storage(open_storage(f"journal:{journal}", setting="hydra.sweeper.storage"), sweep)
            except Exception as error:  # a torn journal
                found = [Study(sweep, journal.name, problem=f"{journal}: could not be read by optuna ({error})")]
        if not found:
            found = [Study(sweep, str((results or {}).get("name", "optuna")))]
        for study in found:
            study.results = results if isinstance(results, dict) else None
            mark_best(study.trials, study.directions)
            match_runs(study.trials, sweep_runs)
            configured = sweep_definition.sweeper_config(sweep).get("objectives")
            if isinstance(configured, list) and len(configured) == len(study.directions):
                study.objectives = [str(o) for o in configured]  # the sweeper's own names
            else:
                study.objectives = name_objectives(study, sweep_runs)
        studies.extend(found)
    return studies


def study_figures(study: Study) -> dict[str, Any]:
    """Optuna's own figures of the study (its matplotlib ones): `history` (objective by trial, best so far)
    and `importances` (fANOVA parameter importances; needs two or more completed trials). For several
    objectives, both are of the first. Missing when there is nothing to draw."""
    complete = [t for t in study.frozen if t.state.name == "COMPLETE"]
    if not complete:
        return {"history": None, "importances": None}
    import warnings

    import matplotlib
    import optuna

    matplotlib.use("Agg")  # files only, whatever display the report runs beside
    from optuna.visualization import matplotlib as optuna_plots

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    memory = optuna.create_study(directions=study.directions)
    memory.add_trials(study.frozen)
    name = study.objectives[0] if study.objectives else "objective 0"
    target = {"target": lambda t: t.values[0], "target_name": name} if len(study.directions) > 1 else \
        {"target_name": name}
    drawn: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib figures experimental
        for key, plot in (("history", optuna_plots.plot_optimization_history),
                          ("importances", optuna_plots.plot_param_importances)):
            try:
                axes = plot(memory, **target)
            except (ValueError, RuntimeError, ZeroDivisionError):  # too few trials or parameters to rank
                drawn[key] = None
                continue
            figure = axes.figure
            figure.set_size_inches(7.5, 4.5)
            figure.set_layout_engine("constrained")
            drawn[key] = figure
    return drawn
