"""dpo-sweeps from Python: compose a config, train it in this process, report a sweep directory.

    from dpo_sweeps import api

    cfg = api.compose(["loss=ipo", "train.max_steps=20"], run_dir="outputs/ipo")
    summary = api.train(cfg)                      # summary.json's record: completed or failed
    print(summary.status, summary.metrics["eval/rewards/accuracies"])
    report = api.report("multirun/quickstart")    # as dpo-sweeps-report writes it
    print(report.text, report.html)
    tied = [c["config"] for c in report.configs if c["tied_with_best"]]   # ranking.csv's rows

`compose` takes the overrides `python -m dpo_sweeps` takes and the same conf/ (Hydra's compose API),
`train` runs the config as that command would, on `resources.nproc_per_node` local ranks (one: in
this process), and `report` is `dpo-sweeps-report`. Sweeps stay commands (`python -m dpo_sweeps -m`):
their jobs are processes of their own. Importing this module loads no training stack.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict, read_write

from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.rundir.paths import remove_empty_run_dir
from dpo_sweeps.rundir.summary import Summary


def compose(overrides: Sequence[str] = (), *, run_dir: str | Path | None = None) -> DictConfig:
    """The config `python -m dpo_sweeps OVERRIDES` runs, `hydra` node included (as Hydra's compose API
    returns it). `run_dir`: where `train` writes (hydra.run.dir; default outputs/DATE/TIME, as the
    command). A key, value or group option the schema refuses, and a grid of values (a sweep's
    `key=a,b`), raise InvalidConfig, naming the setting in one line."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from dpo_sweeps.checks.schema_errors import group_refusal, removed_group_refusal, schema_refusal
    from dpo_sweeps.config import config_dir

    overrides = [*overrides, *([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])]
    refusal = removed_group_refusal(overrides) or _override_refusal(overrides)
    if refusal is not None:
        raise refusal
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3", job_name="dpo_sweeps"):
            return hydra_compose(config_name="config", overrides=overrides, return_hydra_config=True)
    except Exception as exc:
        refusal = schema_refusal(exc) or group_refusal(exc, overrides)
        if refusal is not None:
            raise refusal from None
        from hydra.errors import CompactHydraException

        if isinstance(exc, CompactHydraException):  # a group option that does not exist, a bad override
            raise _hydra_refusal(exc) from None
        raise


def _override_refusal(overrides: list[str]) -> InvalidConfig | None:
    """The InvalidConfig of the first override Hydra cannot parse, or that sweeps (`key=a,b`,
    `choice(...)`, `range(...)`): a sweep's grid, which only the command runs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for line in overrides:
        key, _, value = line.lstrip("+~").partition("=")
        try:
            override = parser.parse_override(line)
        except HydraException as exc:
            problem = str(exc).strip().splitlines()[0].split(" See https://")[0]
            return InvalidConfig(key, f"cannot parse {value!r}: {problem}",
                                 "a value in Hydra's override grammar, e.g. a number, a word, [a,b] for a list, "
                                 "'a,b' quoted for a string")
        if override.is_sweep_override():
            return InvalidConfig(key, f"{value} is a sweep's grid of values",
                                 "one value: api.train runs one config; a sweep is the command, "
                                 f"python -m dpo_sweeps -m {line}")
    return None


def _hydra_refusal(exc: BaseException) -> InvalidConfig:
    """Hydra's own error in one line, as the command prints it, naming its setting (a config group, the
    override it could not parse)."""
    from dpo_sweeps.checks.schema_errors import one_line_message

    line = one_line_message(exc)
    named = re.match(r"([\w.@/+~-]+): ", line) or re.search(r"override '[+~]*([^'=]+)", line)
    return InvalidConfig.worded(named.group(1) if named else "overrides", line)


# What joining a process group sets in this process's environment (parallel/distributed.py): left set, the
# next run in this process would take itself for a rank of torchrun's.
RANK_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def train(config: DictConfig | Sequence[str] = ()) -> Summary:
    """Train one config in this process (and its local ranks) as `python -m dpo_sweeps` would; returns
    the run's Summary (rundir/summary.py: what its summary.json holds), completed or failed: a run that
    started and failed (bad data, a NaN loss, out of memory) is its failed summary. Before anything
    starts, every setting the command refuses raises InvalidConfig, naming it in one line: those of
    `compose`, a value validation refuses (where the command writes a failed summary of kind
    invalid_config), a setting the run does not read, a run directory that holds a completed run of
    another config; an unwritable run directory raises its RunFailure.

    `config`: what `compose` returned, or the overrides to compose. The run directory is the config's
    hydra.run.dir; relative data paths resolve against the current directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import setup_globals
    from hydra.types import RunMode

    from dpo_sweeps.app import train as train_config
    from dpo_sweeps.run_end import RunRefused

    cfg = copy.deepcopy(config if isinstance(config, DictConfig) else compose(config))
    setup_globals()  # Hydra's resolvers (${now:}, ${hydra:}), as when Hydra starts a job
    # What Hydra's run_job sets before it calls the task function.
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.RUN
        cfg.hydra.runtime.output_dir = os.path.abspath(str(cfg.hydra.run.dir))
    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    environment = {name: os.environ.get(name) for name in RANK_VARIABLES}
    hydra_config.set_config(cfg)
    try:
        task_cfg = copy.copy(cfg)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        Path(HydraConfig.get().runtime.output_dir).mkdir(parents=True, exist_ok=True)
        return train_config(task_cfg, HydraConfig.get(), refuse_invalid=True)
    except RunRefused as exc:
        if exc.nothing_written:  # as the command leaves it: no empty run directory
            remove_empty_run_dir(HydraConfig.get().runtime.output_dir)
        raise exc.failure from None
    finally:
        hydra_config.cfg = before
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass(frozen=True)
class Report:
    """What `report` wrote and found: the terminal text, the files (report.html last) and each config's
    ranking.csv row, in its order (`tied_with_best`, `diff_vs_best`, `p_vs_best_adjusted`, `rank_with_ties`,
    ...: INTERFACE.md lists the columns)."""

    text: str
    files: list[Path]
    configs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def html(self) -> Path:
        return self.files[-1]


def report(*sweep_dirs: str | Path, out: str | Path | None = None) -> Report:
    """`dpo-sweeps-report SWEEP_DIR... [--out OUT]`: rank the runs, write the tables, figures and
    report.html (default: SWEEP_DIR/report). Raises NoRunsError when a directory holds no runs."""
    from dpo_sweeps.analysis.report import build_report

    result = build_report([Path(d) for d in sweep_dirs], Path(out) if out is not None else None)
    return Report(result.text, result.files, result.configs)
