"""One job of a sweep, composed before launch exactly as the job itself will compose it.

A sweeper or launcher calls `compose_job` for each point of a sweep; both sweepers hand the jobs
to the launcher with `launch_numbered`, and name their sweep directory in a failed write that names no
file with `writes_in_sweep_dir`. The job's resolved task config and its `config_hash` are
computed the way `dpo_sweeps.app.train` computes them inside the job (resolve, scrub secrets, hash),
so a finished run's summary.json can be matched to a point of a later sweep. Values that depend on
Hydra's job runtime (`${hydra:job.id}`, the output dir) are not known here: a task config key that
interpolates them cannot be matched on resume.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import shlex
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, filter_overrides
from hydra.types import HydraContext
from omegaconf import DictConfig, ListConfig, open_dict, read_write

from dpo_sweeps.checks.schema_errors import group_refusal, schema_refusal
from dpo_sweeps.config.schema import Config
from dpo_sweeps.launchers.compose import PointRecipe, SweepComposer, run_dir_of
from dpo_sweeps.redaction import environment_secrets, redact_text
from dpo_sweeps.rundir.atomic import write_text_atomic
from dpo_sweeps.rundir.hashing import config_hash
from dpo_sweeps.rundir.paths import writing


class SweepJob:
    """A point of a sweep: its number, overrides, composed config, identity and run directory.

    `config` is the composed job config, `hydra` node included (what the launcher's job process runs).
    A sweep of thousands of points does not hold thousands of them: a job composed by `compose_job`
    builds its config from its recipe (launchers/compose.py) each time it is asked for it.
    """

    __slots__ = ("num", "overrides", "_config", "recipe", "task_config", "config_hash", "run_dir", "_sections")

    def __init__(self, num: int, overrides: list[str], config: DictConfig | None, task_config: dict[str, Any],
                 config_hash: str, run_dir: Path, recipe: PointRecipe | None = None):
        self.num = num
        self.overrides = overrides
        self._config = config
        self.recipe = recipe
        # The resolved task config, as `run(cfg)` sees it (before secrets are scrubbed); points of one
        # base share the sections their overrides leave alone, so it is never changed in place.
        self.task_config = task_config
        self.config_hash = config_hash
        self.run_dir = run_dir
        self._sections: dict[str, Any] = {}

    def section(self, name: str) -> Any:
        """One section of the job's resolved config, typed as a rank reads it (Config.section), made once."""
        if name not in self._sections:
            self._sections[name] = Config.section(name, self.task_config[name])
        return self._sections[name]

    @property
    def config(self) -> DictConfig:
        if self._config is not None or self.recipe is None:
            return self._config
        return self.recipe.config(self.num)

    def __repr__(self) -> str:
        return f"SweepJob(#{self.num} {self.label} -> {self.run_dir})"

    @property
    def label(self) -> str:
        """The overrides a reader tells this job by (Hydra's own keys left out)."""
        return " ".join(shlex.quote(o) for o in filter_overrides(self.overrides)) or "(no overrides)"

    @property
    def world_size(self) -> int:
        return self.section("resources").world_size

    def renumbered(self, num: int) -> SweepJob:
        """The same job under another number, hence (usually) another run directory."""
        if self.recipe is not None:
            with _composing:
                _, run_dir = self.recipe.resolve(num)
            return SweepJob(num, self.overrides, None, self.task_config, self.config_hash, run_dir, self.recipe)
        config = copy.deepcopy(self.config)
        _set_job_num(config, num)
        return SweepJob(num=num, overrides=self.overrides, config=config, task_config=self.task_config,
                        config_hash=self.config_hash, run_dir=run_dir_of(config))


def probe_batches(jobs: Sequence[SweepJob], slots: Callable[[SweepJob], int],
                  probes_per_job: int | None = None) -> list[list[int]]:
    """The jobs (by index) as a launcher starts them: each probe batch in one set of rank processes
    (dpo_sweeps/runtime/shared_ranks.py), every other job alone; in order of their first job.

    A batch holds probes (probe.steps > 0) with the same `resources` (the same ranks, device and
    limits): `probes_per_job` of them, or by default as many as spread them evenly over the jobs
    that can run at once (`slots(job)`), so sharing a start-up never costs a probe its parallelism.
    """
    units: list[list[int]] = []
    groups: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        if job.section("probe").steps:
            groups.setdefault(json.dumps(job.task_config["resources"], sort_keys=True), []).append(i)
        else:
            units.append([i])
    for members in groups.values():
        size = probes_per_job or math.ceil(len(members) / slots(jobs[members[0]]))
        units += [members[k:k + size] for k in range(0, len(members), size)]
    return sorted(units)


def launch_numbered(launcher: Any, jobs: list[SweepJob]) -> list[JobReturn]:
    """Run jobs under their own numbers: our launchers take them as they are; any other Hydra
    launcher gets one `launch` call per run of consecutive numbers."""
    if not jobs:
        return []
    if hasattr(launcher, "launch_jobs"):
        return list(launcher.launch_jobs(jobs))
    returns: list[JobReturn] = []
    start = 0
    for end in range(1, len(jobs) + 1):
        if end == len(jobs) or jobs[end].num != jobs[end - 1].num + 1:
            segment = jobs[start:end]
            returns += list(launcher.launch([j.overrides for j in segment], initial_job_idx=segment[0].num))
            start = end
    return returns


def writes_in_sweep_dir(sweep: Callable[..., Any]) -> Callable[..., Any]:
    """A sweeper's `sweep`: a full disk reported without a file name (submitit's job files, multirun.yaml)
    names the sweep directory, so that it is refused in one line naming it (dpo_sweeps/__main__.py)."""

    @functools.wraps(sweep)
    def wrapped(self: Any, arguments: list[str]) -> Any:
        with writing(Path(str(self.config.hydra.sweep.dir)), libraries=False):
            return sweep(self, arguments)

    return wrapped


def write_multirun_yaml(sweep_dir: Path, config: DictConfig) -> None:
    """The sweep's multirun.yaml (its config as Hydra's sweepers write it), every secret redacted."""
    from omegaconf import OmegaConf

    write_text_atomic(Path(sweep_dir) / "multirun.yaml", redact_text(OmegaConf.to_yaml(config), environment_secrets()))


def redact_sweep_config(config: DictConfig) -> None:
    """The sweep's `hydra` node with its secrets redacted, in place, once the sweeper and the launcher have
    taken their settings from it: the jobs are composed from it, and submitit pickles their configs into
    the sweep directory. What needs a secret gets it through the environment (an Optuna storage's
    password, study_storage.py; a SLURM setup line's, slurm/launcher.py)."""

    def redact(node: Any) -> None:
        items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else enumerate(node)
        for key, value in list(items):
            if node is config.hydra and key == "overrides":  # the task's are the jobs' own settings
                continue
            if isinstance(value, (DictConfig, ListConfig)):
                redact(value)
            elif isinstance(value, str) and redact_text(value) != value:
                node[key] = redact_text(value)

    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.overrides.hydra = [redacted_override(o) for o in config.hydra.overrides.hydra]
        redact(config.hydra)


def redacted_override(override: str) -> str:
    """An override with its secrets redacted, quoted so that the jobs, composed from it again, can parse
    it (Hydra's grammar takes no `<` unquoted)."""
    key, _, value = override.partition("=")
    if redact_text(value) == value:
        return override
    if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    quoted = redact_text(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"{key}='{quoted}'"


def override_key(override: str) -> str:
    """`+sweep=quickstart` -> `sweep`; `fsdp=full_shard` -> `fsdp`."""
    return override.split("=", 1)[0].lstrip("+~")


class PointLabels:
    """Names the points of a sweep by what sets each apart (`fsdp=shard_grad_op precision=bf16`);
    the overrides every point shares are listed once (`shared`). Hydra's own `hydra.*` are left out."""

    def __init__(self, points: Sequence[Sequence[str]]):
        points = [[o for o in p if not o.startswith("hydra.")] for p in points]
        self.varying: set[str] | None = None  # None: name every override (a single point)
        self.shared: list[str] = []
        if len(points) > 1:
            values: dict[str, set[str]] = {}
            for point in points:
                for o in point:
                    values.setdefault(override_key(o), set()).add(o)
            everywhere = {k for k in values if all(any(override_key(o) == k for o in p) for p in points)}
            self.varying = {k for k, v in values.items() if len(v) > 1 or k not in everywhere}
            self.shared = [o for o in points[0] if override_key(o) not in self.varying]

    @property
    def shared_words(self) -> str:
        """The shared overrides, shell-quoted as a command line takes them."""
        return " ".join(shlex.quote(o) for o in self.shared)

    def __call__(self, overrides: Sequence[str]) -> str:
        shown = [o for o in overrides if not o.startswith("hydra.")
                 and (self.varying is None or override_key(o) in self.varying)]
        return " ".join(shlex.quote(o) for o in shown) or "(no overrides)"


class JobCompositionError(Exception):
    """A point whose config cannot be composed or resolved (unknown group option, bad interpolation)."""


def compose_job(hydra_context: HydraContext, master_config: DictConfig, overrides: Sequence[str], num: int) -> SweepJob:
    """Compose, resolve and hash one point of a sweep; raises JobCompositionError with a one-line reason.

    Points that choose the same config groups share one composition (launchers/compose.py)."""
    global _composer
    try:
        with _composing:  # a base's working copies serve one point at a time
            if _composer is None or not _composer.serves(hydra_context.config_loader, master_config):
                _composer = SweepComposer(hydra_context.config_loader, master_config)
            composer = _composer
            recipe = composer.recipe(overrides)
            task_config, run_dir = recipe.resolve(num)
            scrubbed = composer.scrubbed(recipe, task_config)
    except Exception as exc:  # Hydra raises several exception types here; all mean "this point is broken".
        # a key or value the schema refuses, or a group given a value that is no option's name, in one line
        refusal = schema_refusal(exc) or group_refusal(exc, list(overrides))
        message = str(refusal) if refusal else str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JobCompositionError(message) from exc
    return SweepJob(num, list(overrides), None, task_config, config_hash(scrubbed), run_dir, recipe)


# The composer of the sweep being composed: its bases serve every point of that sweep.
_composer: SweepComposer | None = None
_composing = threading.Lock()


def _set_job_num(config: DictConfig, num: int) -> None:
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.job.num = num
