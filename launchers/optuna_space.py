"""The Optuna sweeper's search space: Hydra's sweep overrides read as Optuna distributions.

The same syntax as hydra-optuna-sweeper, on the command line or in `hydra.sweeper.params`
(the command line wins for a key given in both):
- `choice(a, b, ...)`: categorical; `shuffle(range(...))`: categorical over the range's values;
- `interval(lo, hi)`: a float between lo and hi, an int when cast (`int(interval(1, 8))`);
  `tag(log, interval(...))` samples it on a log scale;
- `range(start, stop[, step])`: the values Hydra's range gives (start, start + step, ... below
  stop, as in the grid sweeper), ints unless an argument is a float;
- anything else (`train.max_steps=4`, `+sweep=optuna_dpo`, `~key`) is passed to every trial as given.
`hydra.sweeper.custom_search_space` names a function `fn(cfg, trial)` called after these
suggestions, which may suggest more (`trial.suggest_float("+w", 0.0, 1.0)`: `+` adds a new key).

Before a study starts, `SearchSpace.points` gives the points the sweeper checks for settings none of them
reads (launchers/preflight.py `refuse_unread_settings`, as a grid checks all of its own): every combination
of the categorical keys when there are at most `MAX_POINTS`, else each of their values at least once and
combinations drawn at random to fill `MAX_POINTS`; an interval or range at its middle. The forecast a study
prints before its first trial prices a few of them with intervals and ranges at their top as its worst case
(launchers/optuna_loop.py).
"""

from __future__ import annotations

import itertools
import math
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer

# The most points of a search space the sweeper composes, before the study, to see which settings they read.
MAX_POINTS = 32


class SearchSpaceError(ValueError):
    """A swept value the Optuna sweeper cannot search; the message names the key."""


@dataclass(frozen=True)
class Dimension:
    """One searched key: `kind` float, int or categorical, with its bounds or choices."""

    name: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    step: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """Ask the trial for this key's value (Optuna's public suggest API)."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)

    def grid_values(self) -> list[Any]:
        """Every value of this key, for the grid sampler."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.kind == "float" and self.step is None:
            raise SearchSpaceError(f"{self.name}: interval({self.low}, {self.high}) has no grid (accepted with "
                                   "hydra/sweeper/sampler=grid: choice(...) or range(...))")
        count = int(round((self.high - self.low) / (self.step or 1))) + 1
        return [self.low + i * (self.step or 1) for i in range(count)]

    def middle(self) -> float | int:
        """A value inside an interval or range: its middle (on a log scale with `log`), on its step; of two
        values the upper (the low end is often the value that turns something off: 0)."""
        low, high = self.low, self.high
        if self.step:  # a range (Optuna has no log scale with a step)
            value = low + math.ceil(round((high - low) / self.step) / 2) * self.step
            return int(value) if self.kind == "int" else round(float(value), 12)
        value = math.sqrt(low * high) if self.log else (low + high) / 2
        return min(math.ceil(value), high) if self.kind == "int" else float(value)


def _range_dimension(name: str, sweep: RangeSweep) -> Dimension:
    start, stop, step = sweep.start, sweep.stop, sweep.step
    is_float = any(isinstance(v, float) for v in (start, stop, step))
    count = math.ceil((stop - start) / step) if step else 0
    if count < 1:
        raise SearchSpaceError(f"{name}: range({start}, {stop}, step={step}) is empty (accepted: a range with "
                               "at least one value, e.g. range(1, 4) for 1, 2, 3)")
    last = start + (count - 1) * step
    if is_float:
        return Dimension(name, "float", float(start), float(round(last, 12)), float(step))
    return Dimension(name, "int", int(start), int(last), int(step))


def dimension_of(override: Override) -> Dimension:
    """The distribution a sweep override stands for."""
    name = override.get_key_element()
    value = override.value()
    if isinstance(value, ChoiceSweep) or (isinstance(value, RangeSweep) and value.shuffle):
        choices = list(override.sweep_iterator(transformer=Transformer.encode))
        if isinstance(value, RangeSweep):  # a fixed order, so a continued study sees the same distribution
            choices.sort()
        return Dimension(name, "categorical", choices=tuple(choices))
    if isinstance(value, RangeSweep):
        return _range_dimension(name, value)
    if isinstance(value, IntervalSweep):
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return Dimension(name, "int", value.start, value.end, log=log)
        return Dimension(name, "float", float(value.start), float(value.end), log=log)
    raise SearchSpaceError(f"{name}: {override.input_line} cannot be searched by Optuna (accepted: choice(...), "
                           "range(...), interval(...), tag(log, interval(...)))")


def override_text(name: str, value: Any) -> str:
    """`name=value` as a Hydra override."""
    if value is None:
        return f"{name}=null"
    if isinstance(value, bool):
        return f"{name}={str(value).lower()}"
    return f"{name}={value}"


@dataclass
class SearchSpace:
    """The searched keys, in the order given, and the overrides every trial gets as they are."""

    dimensions: dict[str, Dimension] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)
    custom: Callable[[Any, Any], None] | None = None

    @classmethod
    def parse(cls, params: dict[str, Any] | None, arguments: Sequence[str],
              custom_search_space: str | None = None) -> SearchSpace:
        """From `hydra.sweeper.params` and the command line's task overrides."""
        lines = [f"{key}={value}" for key, value in (params or {}).items()] + list(arguments)
        try:
            parsed = OverridesParser.create().parse_overrides(lines)
        except Exception as exc:
            raise SearchSpaceError(f"hydra.sweeper.params: {str(exc).splitlines()[0]}") from None
        space = cls()
        fixed: dict[str, str] = {}
        for override in parsed:
            key = override.get_key_element()
            if override.is_sweep_override():
                space.dimensions[key] = dimension_of(override)
                fixed.pop(key, None)
            else:
                fixed[key if not override.is_delete() else override.input_line] = override.input_line
                space.dimensions.pop(key, None)
        space.fixed = list(fixed.values())
        if custom_search_space:
            space.custom = _function(custom_search_space)
        if not space.dimensions and space.custom is None:
            raise SearchSpaceError("hydra.sweeper.params: nothing to search (accepted: at least one key swept with "
                                   "choice(...), range(...) or interval(...), on the command line or in params)")
        return space

    def suggest(self, trial: Any, config: Any) -> list[str]:
        """The trial's overrides: its suggested values (and the custom function's), then the fixed ones."""
        for dimension in self.dimensions.values():
            dimension.suggest(trial)
        if self.custom is not None:
            self.custom(config, trial)
        return [override_text(name, value) for name, value in trial.params.items()] + self.fixed

    def points(self, config: Any, grid: dict[str, list[Any]] | None = None, enqueued: Sequence[dict] = (),
               limit: int = MAX_POINTS, at_top: bool = False) -> list[list[str]]:
        """The overrides of points this space can produce, as trials get them (`suggest`, the custom
        function included, on an in-memory study): the categorical keys' combinations (`grid`: every
        key's grid values, the grid sampler's points) with intervals and ranges at their middle (`at_top`:
        their top, where a key that sets a size, a batch, a length, steps, costs the most), then the
        `enqueued` trials. A point the custom function cannot make is left out."""
        import optuna

        fixed = {name: d.high if at_top else d.middle() for name, d in self.dimensions.items()
                 if d.kind != "categorical" and not grid}
        values = self._combined(grid)
        level = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created in memory" is not news
        points = []
        try:
            with warnings.catch_warnings():  # nor an enqueued value out of range: the study warns of it itself
                warnings.simplefilter("ignore")
                study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
                for params in [{**fixed, **combo} for combo in combinations(values, limit)] + list(enqueued):
                    study.enqueue_trial(params)
                    try:
                        points.append(self.suggest(study.ask(), config))
                    except Exception:  # as a trial that gets no parameters (launchers/optuna_loop.py): not run
                        continue
        finally:
            optuna.logging.set_verbosity(level)
        return points

    def every_point_checked(self, grid: dict[str, list[Any]] | None = None, limit: int = MAX_POINTS) -> bool:
        """Whether `points` covers every combination of the categorical keys: not when it draws a sample
        of them, nor when a custom function may suggest more than it is shown here."""
        return self.custom is None and math.prod(len(v) for v in self._combined(grid).values()) <= limit

    def _combined(self, grid: dict[str, list[Any]] | None) -> dict[str, list[Any]]:
        """The values `points` combines: the grid's, else every categorical key's choices."""
        return grid or {name: list(d.choices) for name, d in self.dimensions.items() if d.kind == "categorical"}

    def grid(self) -> dict[str, list[Any]]:
        return {name: d.grid_values() for name, d in self.dimensions.items()}

    def describe(self) -> list[str]:
        lines = []
        for d in self.dimensions.values():
            if d.kind == "categorical":
                lines.append(f"{d.name}: choice({', '.join(map(str, d.choices))})")
            else:
                extra = (f", step={d.step}" if d.step else "") + (", log" if d.log else "")
                lines.append(f"{d.name}: {d.kind} in [{d.low}, {d.high}]{extra}")
        if self.custom is not None:
            lines.append(f"and what {self.custom.__module__}.{self.custom.__name__} suggests")
        return lines


def combinations(values: dict[str, list[Any]], limit: int = MAX_POINTS, seed: int = 0) -> list[dict[str, Any]]:
    """Every combination of `values` (key -> its values) when there are at most `limit`; else `limit` of
    them: each value of every key at least once (as far as `limit` goes), the rest drawn at random."""
    names = list(values)
    if math.prod(len(v) for v in values.values()) <= limit:
        return [dict(zip(names, combo)) for combo in itertools.product(*values.values())]
    rng = random.Random(seed)
    orders = {name: rng.sample(v, len(v)) for name, v in values.items()}  # so equal lengths do not pair alike
    widest = max(len(v) for v in values.values())
    picked = [tuple(orders[n][i % len(orders[n])] for n in names) for i in range(min(widest, limit))]
    seen = {repr(combo) for combo in picked}
    while len(picked) < limit:
        combo = tuple(rng.choice(values[n]) for n in names)
        if repr(combo) not in seen:
            seen.add(repr(combo))
            picked.append(combo)
    return [dict(zip(names, combo)) for combo in picked]


def _function(path: str) -> Callable[[Any, Any], None]:
    from hydra.utils import get_method

    try:
        return get_method(path)
    except Exception as exc:
        raise SearchSpaceError(f"hydra.sweeper.custom_search_space: {path}: {str(exc).splitlines()[0]} (accepted: "
                               "the dotted path of a function fn(cfg, trial), e.g. mypkg.space.configure)") from None
