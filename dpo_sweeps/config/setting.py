"""One place per setting: a schema field made with `setting(...)` carries its default, the values it accepts
and the condition under which a run reads it; the docstring under the field is what it does.

    max_steps: int = setting(120, accepted=AtLeast(1))
    \"\"\"Optimizer steps to train (>= 1).\"\"\"

From these, with nothing else to edit: `Section.check` refuses a value the field does not accept (one
InvalidConfig line naming it and what is accepted), checks/unused.py refuses the setting on a command line
whose config would not read it (`read_when`), the `--help` listing (config/settings_help.py) and the config
reference page show it, conf/config.yaml need not repeat its default, and a setting added to a released
schema (`older_runs_lack=True`) leaves the older runs' config_hash as it was (rundir/hashing.py). Every value
field of the schema is made this way (tests/unit/test_one_place_per_setting.py), the per-choice sections'
too (`data` per source, `loss` per loss: `choices` names their schemas).

A read condition that needs a library to decide (whether the loss has a reference, whether a path is local)
is a `Rule`, named beside the field and decided by checks/unused.py, so that config/ imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NoReturn

from omegaconf import MISSING

from dpo_sweeps.errors import InvalidConfig

# A field's metadata key for its Setting.
SETTING = "setting"
# A `Config` field's metadata key for the schemas of a section typed per choice ({choice: its dataclass}).
CHOICES = "choices"


class Launch(StrEnum):
    """Who starts a run's ranks (some settings are read only when dpo-sweeps starts them itself)."""

    DPO_SWEEPS = "dpo_sweeps"  # `python -m dpo_sweeps`: its own process, or local rank processes it spawns
    TORCHRUN = "torchrun"
    LOCAL = "local"  # a local sweep's job: one rank in the job's process, or submitit tasks
    SLURM = "slurm"  # a SLURM job's tasks (srun binds them)


@dataclass(frozen=True)
class Rule:
    """A read condition named, not written, here: deciding it needs library code above config/ (the loss
    registry's reference use, the data sources' idea of a local path, an adapter folder on disk), so
    checks/unused.py CONDITIONS maps the name to its test when it checks (unknown names fail its table)."""

    name: str


@dataclass(frozen=True)
class ReadWhen:
    """A setting is read only when `unused(config, launch)` is false (a `Rule`: the test checks/unused.py
    registers under its name); set where it is not, it is refused with `why` and `instead` (what would make
    it act, or what acts instead)."""

    unused: Callable[[Any, Launch], bool] | Rule
    why: str
    instead: str


def refuse(setting: str, problem: str, accepted: str) -> NoReturn:
    raise InvalidConfig(setting, problem, accepted)


def at_least(value: Any, minimum: int, setting: str, accepted: str | None = None) -> None:
    """An integer >= minimum."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        refuse(setting, f"got {value!r}", accepted or f"an integer >= {minimum}")


def positive_number(value: Any, setting: str, accepted: str) -> None:
    """A number > 0, or null."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        shown = int(value) if isinstance(value, float) and value.is_integer() else value  # the schema made 0 0.0
        refuse(setting, f"got {shown!r}", accepted)


class Accepted:
    """The values a setting accepts: `text` says them (in the refusal, --help and the docs); `check` refuses
    any other."""

    text: str

    def check(self, value: Any, setting: str) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class OneOf(Accepted):
    """One of `choices` (with `null`, or null); `unknown` names what a wrong value is ("unknown optimizer
    'x'"), else "got 'x'"."""

    choices: tuple[str, ...]
    unknown: str | None = None
    null: bool = False
    said: str | None = None  # how the refusal says them, when the list alone says too little

    @property
    def text(self) -> str:
        return self.said or ", ".join(("null", *self.choices) if self.null else self.choices)

    def check(self, value: Any, setting: str) -> None:
        if value not in self.choices and not (self.null and value is None):
            refuse(setting, f"unknown {self.unknown} '{value}'" if self.unknown else f"got {value!r}", self.text)


@dataclass(frozen=True)
class AtLeast(Accepted):
    """An integer >= minimum; with `null`, also null."""

    minimum: int
    said: str | None = None  # how the refusal says it, when "an integer >= N" says too little
    null: bool = False

    @property
    def text(self) -> str:
        return self.said or f"an integer >= {self.minimum}" + (", or null" if self.null else "")

    def check(self, value: Any, setting: str) -> None:
        if not (self.null and value is None):
            at_least(value, self.minimum, setting, self.text)


@dataclass(frozen=True)
class Positive(Accepted):
    """A number > 0 (null passes: a setting typed `float | None` says what null means in `text`)."""

    text: str = "a number > 0"

    def check(self, value: Any, setting: str) -> None:
        positive_number(value, setting, self.text)


@dataclass(frozen=True)
class NumberAtLeast(Accepted):
    """A number >= minimum."""

    minimum: float
    text: str

    def check(self, value: Any, setting: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < self.minimum:
            refuse(setting, f"got {value!r}", self.text)


@dataclass(frozen=True)
class Setting:
    """A schema field's metadata: what it accepts and when it is read (no `read_when`: by every run)."""

    accepted_values: Accepted | None = None
    read_when: tuple[ReadWhen, ...] = ()
    older_runs_lack: bool = False
    """Added after runs were written: at its default it trains as those runs did, so config_hash leaves it
    out there (rundir/hashing.py), and their sweep directories still resume."""

    @property
    def accepted(self) -> str | None:
        """What it accepts, in words (the config reference page shows a metadata's `accepted`)."""
        return self.accepted_values.text if self.accepted_values is not None else None


def setting(default: Any = MISSING, *, accepted: Accepted | None = None,
            read_when: ReadWhen | tuple[ReadWhen, ...] = (), older_runs_lack: bool = False,
            default_factory: Callable[[], Any] | None = None) -> Any:
    """A schema field with its default (omegaconf's MISSING: a conf/ group file sets it), what it accepts,
    when it is read, and whether runs written before it existed lack it (`older_runs_lack`: a setting added
    to a released schema, whose default keeps the old behaviour)."""
    when = (read_when,) if isinstance(read_when, ReadWhen) else tuple(read_when)
    metadata = {SETTING: Setting(accepted, when, older_runs_lack)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def setting_of(field: dataclasses.Field) -> Setting | None:
    """The field's Setting; None for a field not made with `setting`."""
    return field.metadata.get(SETTING)


def choices(schemas: dict[str, type]) -> Any:
    """A `Config` field typed per choice (`data` per source, `loss` per loss): MISSING until conf/'s group file
    sets it, typed by the schema of the choice (`schemas`, {choice: dataclass}; a module may fill it later, as
    dpo/losses/schema.py fills the losses'). Its keys are the settings of those schemas (section.py
    setting_fields)."""
    return dataclasses.field(default=MISSING, metadata={CHOICES: schemas})
