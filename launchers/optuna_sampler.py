"""The Optuna sweeper's sampler: `hydra.sweeper.sampler` (conf/hydra/sweeper/sampler/*.yaml), made per trial.

A study continued by a second invocation, or shared by several sweep processes, must not replay
the trials already drawn: one sampler seeded once per process would give every process the same
draws (the first trial of a continued study would be trial 0 again). So with `seed` set, each
trial is drawn by a fresh sampler seeded from (seed, trial number): trial numbers are unique in
the study, every draw is reproducible, and no two trials share a stream. Optuna's samplers keep
what they learn in the storage (history, CMA-ES and NSGA-II state), not in the sampler object.
The QMC sampler is the exception: its sequence is defined by its seed, so it keeps the one given.

The samplers that take constraints (TPE, NSGA-II, GP) learn to avoid points the fit check skipped
from the memory constraint the sweeper sets on each trial (launchers/optuna_loop.py): through
`Trial.set_constraint` where Optuna has it (5.0 on; it deprecates `constraints_func`), else through
a `constraints_func` that reads the trial's user attribute.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpo_sweeps.launchers.preflight import InvalidSweep
from dpo_sweeps.train.study_storage import MEMORY_CONSTRAINT


def memory_constraint(trial: Any) -> Sequence[float]:
    """Optuna's constraints_func: feasible when <= 0 (trials without a fit check count as fitting)."""
    return [float(trial.user_attrs.get(MEMORY_CONSTRAINT, 0.0))]


def constraints_per_trial() -> bool:
    """Optuna has `Trial.set_constraint` (5.0 on): constraints are set on the trial, not computed by the sampler."""
    import optuna

    return hasattr(optuna.trial.Trial, "set_constraint")


def trial_seed(seed: int, number: int) -> int:
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def sampler_factory(config: dict[str, Any], grid: dict[str, list[Any]],
                    constrain_memory: bool) -> tuple[str, Callable[[int | None], Any], bool]:
    """(sampler class name, make(seed), whether it takes the memory constraint) for `hydra.sweeper.sampler`;
    refuses settings the sampler does not have. `grid`: the search space as the grid sampler takes it."""
    from hydra.utils import get_class

    settings = dict(config)
    target = settings.pop("_target_", None)
    settings.pop("_partial_", None)
    try:
        cls = get_class(str(target))
    except Exception:
        raise InvalidSweep(f"hydra.sweeper.sampler._target_: {target!r} is not a sampler class (accepted: "
                           "hydra/sweeper/sampler=tpe, random, cmaes, nsgaii, grid, qmc or gp)") from None
    accepted = [p for p in inspect.signature(cls).parameters if p not in ("self", "search_space")]
    unknown = sorted(set(settings) - set(accepted))
    if unknown:
        raise InvalidSweep(f"hydra.sweeper.sampler.{unknown[0]}: not a setting of {cls.__name__} "
                           f"(accepted: {', '.join(accepted)})")
    constrained = constrain_memory and "constraints_func" in accepted and settings.get("constraints_func") is None
    if constrained and not constraints_per_trial():
        settings["constraints_func"] = memory_constraint
    search = grid if "search_space" in inspect.signature(cls).parameters else None

    def make(seed: int | None) -> Any:
        kwargs = {**settings, **({"seed": seed} if "seed" in accepted else {})}
        return cls(search, **kwargs) if search is not None else cls(**kwargs)

    try:
        make(settings.get("seed"))
    except (TypeError, ValueError) as exc:
        raise InvalidSweep(f"hydra.sweeper.sampler: {cls.__name__}: {exc} (accepted: the settings of optuna's "
                           f"{cls.__name__}: {', '.join(accepted)})") from None
    except ImportError as exc:  # cmaes for CmaEsSampler, scipy for QMCSampler and GPSampler
        raise InvalidSweep(f"hydra.sweeper.sampler: {cls.__name__} needs a package that is not installed: "
                           f"{str(exc).splitlines()[0]} (accepted: pip install it, or another sampler)") from None
    return cls.__name__, make, constrained


def trial_seeded_sampler(name: str, make: Callable[[int | None], Any], seed: int | None,
                         grid_space: dict[str, list[Any]]) -> Any:
    """The study's sampler: `make(seed)`, re-made for each trial from (seed, trial number) (see above)."""
    from optuna.samplers import BaseSampler

    class TrialSeededSampler(BaseSampler):
        def __init__(self) -> None:
            self.current = make(seed)

        def before_trial(self, study: Any, trial: Any) -> None:
            if seed is not None and name != "QMCSampler":
                self.current = make(trial_seed(seed, trial.number))
            self.current.before_trial(study, trial)

        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            return self.current.infer_relative_search_space(study, trial)

        def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
            return self.current.sample_relative(study, trial, search_space)

        def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
            return self.current.sample_independent(study, trial, param_name, param_distribution)

        def after_trial(self, study: Any, trial: Any, state: Any, values: Sequence[float] | None) -> None:
            # The grid sampler stops an optimize() loop when its grid is done (Study.stop, which raises
            # outside one); this sweep has its own loop, which asks `exhausted` instead.
            if name != "GridSampler":
                self.current.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:
            self.current.reseed_rng()

        def points_left(self, study: Any) -> int | None:
            """How many points the grid sampler has yet to start (None: other samplers never run out)."""
            if name != "GridSampler":
                return None
            return max(0, math.prod(len(values) for values in grid_space.values()) - len(study.get_trials(deepcopy=False)))

        def exhausted(self, study: Any) -> bool:
            """The grid sampler has started every point of its grid (other samplers never do)."""
            if name != "GridSampler":
                return False
            points = math.prod(len(values) for values in grid_space.values())
            return len(study.get_trials(deepcopy=False)) >= points or self.current.is_exhausted(study)

    return TrialSeededSampler()
