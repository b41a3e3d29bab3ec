"""One job of a sweep, composed before launch exactly as the job itself will compose it.

A sweeper or launcher calls `compose_job` for each point of a sweep. The job's resolved task
config and its `config_hash` are computed the way `dpo_sweeps.app.run` computes them inside the
job (resolve, scrub secrets, hash), so a finished run's summary.json can be matched to a point of
a later sweep. Values that depend on Hydra's job runtime (`${hydra:job.id}`, the output dir) are
not known here: a task config key that interpolates them cannot be matched on resume.
"""

from __future__ import annotations

import copy
import json
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import filter_overrides
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from dpo_sweeps.config.schema_errors import schema_refusal
from dpo_sweeps.rundir.outputs import config_hash, scrub_secrets


@dataclass
class SweepJob:
    """A point of a sweep: its number, overrides, composed config, identity and run directory."""

    num: int
    overrides: list[str]
    # The composed job config, `hydra` node included (what the launcher's job process composes).
    config: DictConfig
    # The resolved task config, as `run(cfg)` sees it (before secrets are scrubbed).
    task_config: dict[str, Any]
    config_hash: str
    run_dir: Path

    @property
    def label(self) -> str:
        """The overrides a reader tells this job by (Hydra's own keys left out)."""
        return " ".join(shlex.quote(o) for o in filter_overrides(self.overrides)) or "(no overrides)"

    @property
    def world_size(self) -> int:
        res = self.task_config["resources"]
        return res["nodes"] * res["nproc_per_node"]

    def renumbered(self, num: int) -> SweepJob:
        """The same job under another number, hence (usually) another run directory."""
        config = copy.deepcopy(self.config)
        _set_job_num(config, num)
        return SweepJob(num=num, overrides=self.overrides, config=config, task_config=self.task_config,
                        config_hash=self.config_hash, run_dir=_run_dir(config))


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
        if job.task_config["probe"]["steps"]:
            groups.setdefault(json.dumps(job.task_config["resources"], sort_keys=True), []).append(i)
        else:
            units.append([i])
    for members in groups.values():
        size = probes_per_job or math.ceil(len(members) / slots(jobs[members[0]]))
        units += [members[k:k + size] for k in range(0, len(members), size)]
    return sorted(units)


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
    """Compose, resolve and hash one point of a sweep; raises JobCompositionError with a one-line reason."""
    try:
        config = hydra_context.config_loader.load_sweep_config(master_config, list(overrides))
        _set_job_num(config, num)
        task_config = _resolved_task_config(config)
        run_dir = _run_dir(config)
    except Exception as exc:  # Hydra raises several exception types here; all mean "this point is broken".
        refusal = schema_refusal(exc)  # a key or value the schema refuses, named in one line
        message = str(refusal) if refusal else str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JobCompositionError(message) from exc
    return SweepJob(num=num, overrides=list(overrides), config=config, task_config=task_config,
                    config_hash=config_hash(scrub_secrets(task_config)), run_dir=run_dir)


def _set_job_num(config: DictConfig, num: int) -> None:
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.job.num = num


class _HydraConfigAs:
    """Make `${hydra:...}` resolve against one job's config for a moment (the job process does the same)."""

    def __init__(self, config: DictConfig):
        self.config = config

    def __enter__(self) -> None:
        self.saved = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(self.config)

    def __exit__(self, *exc: object) -> None:
        HydraConfig.instance().cfg = self.saved


def _resolved_task_config(config: DictConfig) -> dict[str, Any]:
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    with _HydraConfigAs(config):
        container = OmegaConf.to_container(task, resolve=True)
    assert isinstance(container, dict)
    return container


def _run_dir(config: DictConfig) -> Path:
    """`hydra.sweep.dir`/`hydra.sweep.subdir`, as hydra.core.utils.run_job joins them."""
    with _HydraConfigAs(config):
        sweep_dir = str(OmegaConf.select(config, "hydra.sweep.dir"))
        subdir = str(OmegaConf.select(config, "hydra.sweep.subdir"))
    return Path(sweep_dir) / subdir
