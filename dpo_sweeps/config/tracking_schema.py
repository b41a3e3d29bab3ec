"""The schema of `tracking`: where rank 0 reports a run (dpo_sweeps/tracking/), one section per tracker, each
field made with `setting(...)` (setting.py): its default, what it accepts and when it is read. `wandb.*`, the
name W&B's section had before issue 49, is still accepted for one release (`FormerWandbConfig`, `RENAMED`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dpo_sweeps.config.section import Section, refuse
from dpo_sweeps.config.setting import OneOf, ReadWhen, setting

WANDB_MODES = ("offline", "online", "disabled")
TRACKING_BACKENDS = ("wandb", "mlflow", "tensorboard", "trackio")


def _unless_backend(backend: str, name: str) -> ReadWhen:
    """A backend's settings are read only when tracking.backends lists it."""
    return ReadWhen(lambda c, _: backend not in c.tracking.backends, f"{name} is not among tracking.backends",
                    f"tracking.backends=[{backend},...]")


# tracking.wandb.project, entity and group: what W&B is told, when it is told anything.
_NO_WANDB = (ReadWhen(lambda c, _: c.tracking.wandb.mode == "disabled", "nothing is logged to W&B with "
                      "tracking.wandb.mode=disabled", "tracking.wandb.mode=offline or online"),
             _unless_backend("wandb", "W&B"))


@dataclass
class WandbConfig(Section):
    """tracking.backends=[..., wandb] (the default): W&B, offline unless told otherwise (tracking/wandb_backend.py).
    Until issue 49 these keys were `wandb.*`; that spelling is still accepted, with a notice (RENAMED)."""

    at = "tracking.wandb"

    mode: str = setting("offline", accepted=OneOf(WANDB_MODES))
    """offline | online | disabled."""
    project: str = setting("dpo-sweeps", read_when=_NO_WANDB)
    """The W&B project."""
    entity: str | None = setting(None, read_when=_NO_WANDB)
    """The W&B entity (team or user); null: W&B's default."""
    group: str | None = setting(None, read_when=_NO_WANDB)
    """The W&B group; null: the sweep directory's name for sweeps, the run name otherwise."""


@dataclass
class FormerWandbConfig(Section):
    """The keys `tracking.wandb.*` had before issue 49, as `wandb.*`: accepted for one more release. A value
    set here (null: not set) is moved to tracking.wandb when the config is read (`Config.of`; a new key given
    too wins), and the command-line check says the new name in a one-line notice (checks/unused.py)."""

    mode: str | None = None
    """Now tracking.wandb.mode."""
    project: str | None = None
    """Now tracking.wandb.project."""
    entity: str | None = None
    """Now tracking.wandb.entity."""
    group: str | None = None
    """Now tracking.wandb.group."""


# Sections renamed, old name -> new: the old keys are accepted for one release (FormerWandbConfig).
RENAMED = {"wandb": "tracking.wandb"}


def renamed_key(key: str) -> str:
    """The current name of a dotted key (`wandb.mode` -> tracking.wandb.mode); any other key as it is."""
    for old, new in RENAMED.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return key


def move_renamed(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """A resolved config with the values set under a renamed section's old keys moved to the new ones (a
    config from before the rename, a summary.json among them, reads as it did); the old section left empty.
    Where both names are given, the new one wins: an old key moves only onto a new key at its default."""
    former = values.get("wandb")
    if not isinstance(former, Mapping) or all(v is None for v in former.values()):
        return values
    tracking = dict(values.get("tracking") or {})
    current = dict(tracking.get("wandb") or {})
    defaults = {f.name: f.default for f in fields(WandbConfig)}
    for key, value in former.items():
        if value is not None and current.get(key, defaults.get(key)) == defaults.get(key):
            current[key] = value
    tracking["wandb"] = current
    return {**values, "tracking": tracking, "wandb": {}}


_NO_MLFLOW = _unless_backend("mlflow", "MLflow")


@dataclass
class MlflowConfig(Section):
    """tracking.backends=[..., mlflow]: the sweep is one parent run, each job a nested run (docs/trackers.md)."""

    at = "tracking.mlflow"

    tracking_uri: str | None = setting(None, read_when=_NO_MLFLOW)
    """The MLflow tracking URI: http(s)://host:port of an `mlflow server`, file:/path or sqlite:///path.db;
    null: the MLFLOW_TRACKING_URI environment variable. No credentials in it: MLflow reads
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) from the environment."""
    experiment_name: str = setting("dpo-sweeps", read_when=_NO_MLFLOW)
    """The MLflow experiment the runs go in (created when missing)."""

    def check(self) -> None:
        # The URI's form is checked in validate.py (it parses URLs; this module imports only the schema's needs).
        if not self.experiment_name.strip():
            refuse("tracking.mlflow.experiment_name", "got an empty name", "an MLflow experiment name")


_NO_TENSORBOARD = _unless_backend("tensorboard", "TensorBoard")


@dataclass
class TensorboardConfig(Section):
    """tracking.backends=[..., tensorboard]: event files in each run's directory, so `tensorboard --logdir
    <sweep dir>` shows every run of a sweep, with its settings in the HParams tab."""

    at = "tracking.tensorboard"

    subdir: str = setting("tensorboard", read_when=_NO_TENSORBOARD)
    """The event directory inside each run directory."""

    def check(self) -> None:
        if not self.subdir or self.subdir.startswith("/") or ".." in self.subdir.split("/"):
            refuse("tracking.tensorboard.subdir", f"got {self.subdir!r}", "a relative folder name inside the run directory")


_NO_TRACKIO = _unless_backend("trackio", "Trackio")


@dataclass
class TrackioConfig(Section):
    """tracking.backends=[..., trackio]: the sweep is a Trackio project, each job a run in it."""

    at = "tracking.trackio"

    project: str | None = setting(None, read_when=_NO_TRACKIO)
    """The Trackio project; null: the sweep's name (its group), or the run's name for a single run."""


@dataclass
class TrackingConfig(Section):
    """Where rank 0 reports a run: every backend gets the resolved config (secrets scrubbed), every
    metrics.jsonl metric at its step, the plan label, and the status and failure kind at the end
    (dpo_sweeps/tracking/). A backend that fails is a warning, never a failed run."""

    backends: list[str] = setting(default_factory=lambda: ["wandb"])
    """Any of wandb, mlflow, tensorboard, trackio (tracking.wandb.* configures wandb); [] logs to files only."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    tensorboard: TensorboardConfig = field(default_factory=TensorboardConfig)
    trackio: TrackioConfig = field(default_factory=TrackioConfig)

    def check(self) -> None:
        self.wandb.check()  # its mode is read whatever the backends: disabled turns W&B off
        for name in self.backends:
            if name not in TRACKING_BACKENDS:
                refuse("tracking.backends", f"got {name!r}", f"a list of {', '.join(TRACKING_BACKENDS)}")
        if len(set(self.backends)) != len(self.backends):
            refuse("tracking.backends", f"names a backend twice: {list(self.backends)}", "each backend once")
        for name in ("mlflow", "tensorboard", "trackio"):
            if name in self.backends:
                getattr(self, name).check()
