"""Compose the points of a sweep: one Hydra composition per distinct choice of config groups.

Hydra's `load_sweep_config` composes every job from scratch (defaults tree, config files, merges),
which is most of a large sweep's cost before launch. Yet Hydra itself composes a job in two steps:
the overrides that choose config groups (`model=...`, `+sweep=...`, `hydra/launcher=...`) decide
the defaults tree and the merged config; every other override (`loss.beta=0.5`, `+train.x=1`,
`++a.b=2`, `~a.b`) is applied afterwards, in order, to that config (Hydra's private `_apply_overrides_to_config`, borrowed
through hydra_private.py with the other private names the project uses).
So points that differ only in values share one composed base (`_Base`), and a point's own config is
that base with its value overrides applied the same way, plus the per-job entries Hydra writes
(`hydra.overrides.task`, `hydra.job.override_dirname`, `hydra.job.num`): `PointRecipe.config()`.

The sweeper needs each point's resolved task config, hash and run directory, not the whole
config. Where the base's task config holds no interpolation, the value overrides carry none and each
stays inside one top-level section (`train.seed=3`, not `+newtop=1`), a point's task config is the
base's with only the sections its overrides touch copied and changed (`_fast_task_config`); its run
directory is resolved on one working copy of the base per sweep. Anything else takes the exact road:
the point's full config, resolved as the job resolves it. Points that fall back to Hydra's own full
composition: those whose overrides change `hydra.searchpath` (it decides what a group is), and
any point whose override cannot be parsed on its own. tests/unit/test_compose.py compares
both roads with `load_sweep_config` on a mixed grid.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from dpo_sweeps.launchers.hydra_private import apply_overrides, config_group_test, overrides_dirname, raw_node
from dpo_sweeps.redaction import scrub_secrets

# The interpolations a sweep's run directory (hydra.sweep.dir, hydra.sweep.subdir) may use for the
# fast road: the job's number and override dirname (set per point), its name and `now` (the same for
# every point). Any other (a task key, the job id) sends the base's points down the exact road.
# `a.b=12`: a value override of an integer, as Hydra's grammar reads one (no sign '+', no '_', no leading 0).
INT_OVERRIDE = re.compile(r"(?P<key>[A-Za-z_]\w*(\.[A-Za-z_]\w*)+)=(?P<value>-?(0|[1-9][0-9]*))")
RUN_DIR_INTERPOLATION = re.compile(r"\$\{(hydra[.:]job\.(num|override_dirname|name)|now:[^${}]*)\}")


class SweepComposer:
    """The configs of one sweep's points (`master`: the sweep's own config, as the sweeper got it)."""

    def __init__(self, config_loader: Any, master: DictConfig):
        self.loader = config_loader
        self.master = master
        self.master_hydra_overrides = list(OmegaConf.to_container(master.hydra.overrides.hydra))
        self.parser = OverridesParser.create(config_loader=config_loader)
        self.is_group = config_group_test(config_loader, master.hydra.job.config_name, self.master_hydra_overrides)
        self._parsed: dict[str, Override | None] = {}
        self._is_group: dict[str, bool] = {}
        self._bases: dict[tuple[str, ...], _Base | Exception] = {}

    def serves(self, config_loader: Any, master: DictConfig) -> bool:
        """Whether this composer's bases hold for `master` (the same config, as many hydra overrides)."""
        return (self.loader is config_loader and self.master is master
                and len(master.hydra.overrides.hydra) == len(self.master_hydra_overrides))

    def scrubbed(self, recipe: PointRecipe, task_config: dict[str, Any]) -> dict[str, Any]:
        """scrub_secrets(task_config), reusing the base's scrubbed sections the point left as they were."""
        base = recipe.base
        if not isinstance(base, _Base) or base.resolved is None:
            return scrub_secrets(task_config)
        if base.scrubbed is None:
            base.scrubbed = scrub_secrets(base.resolved)
        return {k: base.scrubbed[k] if v is base.resolved.get(k) else scrub_secrets({k: v})[k]
                for k, v in task_config.items()}

    def recipe(self, overrides: Sequence[str]) -> PointRecipe:
        """How to build this point's config; raises what Hydra's composition of the point would raise."""
        parsed = [self._parse(o) for o in overrides]
        if any(p is None for p in parsed) or any(p.key_or_group.startswith("hydra.searchpath") for p in parsed):
            return PointRecipe(self, None, list(overrides), [], [])
        # As Hydra's defaults_list.Overrides sorts them: a dict value or a key that names no config group
        # is a value override; hydra.* overrides go with the base (they never touch the task config).
        base_key, values = [], []
        for p in parsed:
            if p.is_hydra_override() or (not isinstance(p.value(), dict) and self._group(p.key_or_group)):
                base_key.append(p.input_line)
            else:
                values.append(p)
        base = self._base(tuple(base_key))
        task_lines = [p.input_line for p in parsed if not p.is_hydra_override()]
        return PointRecipe(self, base, list(overrides), values, task_lines, [p for p in parsed if not p.is_hydra_override()])

    def _parse(self, override: str) -> Override | None:
        if override not in self._parsed:
            self._parsed[override] = self._parse_int(override) or self._parse_new(override)
        return self._parsed[override]

    def _parse_new(self, override: str) -> Override | None:
        try:
            return self.parser.parse_overrides([override])[0]
        except Exception:  # Hydra's full composition reports it, in its own words
            return None

    def _parse_int(self, override: str) -> Override | None:
        """`key=<integer>` (a swept range of seeds): the parse of `key=0` with the value put in, as
        Hydra's grammar reads a plain decimal integer (its parser is most of a point's cost)."""
        found = INT_OVERRIDE.fullmatch(override)
        if found is None:
            return None
        zero = f"{found['key']}=0"
        if zero not in self._parsed:
            self._parsed[zero] = self._parse_new(zero)
        template = self._parsed[zero]
        if (template is None or template.type != OverrideType.CHANGE or template.value_type != ValueType.ELEMENT
                or template.value() != 0 or template.package is not None):
            return None
        return dataclasses.replace(template, _value=int(found["value"]), input_line=override)

    def _group(self, key: str) -> bool:
        if key not in self._is_group:
            self._is_group[key] = self.is_group(key)
        return self._is_group[key]

    def _base(self, key: tuple[str, ...]) -> _Base | Exception:
        if key not in self._bases:
            try:
                self._bases[key] = _Base(self, self.loader.load_sweep_config(self.master, list(key)), len(
                    [o for o in key if not self._parse(o).is_hydra_override()]))
            except Exception as exc:  # every point of this base fails the same way: the value overrides come later
                self._bases[key] = exc
        return self._bases[key]


class _Base:
    """One composed base config, the task config it resolves to, and what the fast road may use."""

    def __init__(self, composer: SweepComposer, config: DictConfig, group_task_lines: int):
        self.composer = composer
        self.config = config
        task_list = list(OmegaConf.to_container(config.hydra.overrides.task))
        # What Hydra's task list holds before any override of the point is appended (normally nothing).
        self.task_lines_before = task_list[:len(task_list) - group_task_lines]
        dirname = config.hydra.job.config.override_dirname
        self.dirname_settings = {"kv_sep": dirname.kv_sep, "item_sep": dirname.item_sep,
                                 "exclude_keys": list(dirname.exclude_keys)}
        self.task = copy.deepcopy(config)  # as the job sees it: the config without its hydra node
        with read_write(self.task), open_dict(self.task):
            del self.task["hydra"]
        unresolved = OmegaConf.to_container(self.task, resolve=False)
        self.resolved = unresolved if "${" not in repr(unresolved) else None  # None: it interpolates
        self.scrubbed: dict[str, Any] | None = None
        sweep = OmegaConf.to_container(config.hydra.sweep, resolve=False)
        self.run_dir_fast = all(RUN_DIR_INTERPOLATION.sub("", str(sweep[k])).count("${") == 0 for k in ("dir", "subdir"))
        self._working: DictConfig | None = None  # the copy run directories are resolved on
        self._sections: dict[str, DictConfig] = {}
        # Hydra's default layout, <sweep dir>/<job number>: the sweep dir is the same for every point.
        self._numbered_in: Path | None = None
        if sweep["subdir"] in ("${hydra.job.num}", "${hydra:job.num}") and "job." not in str(sweep["dir"]):
            self._numbered_in = self.run_dir(0, "").parent

    def working_section(self, section: str) -> DictConfig:
        """A copy of one section of the base's task config, kept for points that only change its leaves."""
        if section not in self._sections:
            self._sections[section] = copy.deepcopy(raw_node(self.task, section))
        return self._sections[section]

    def run_dir(self, num: int, override_dirname: str) -> Path:
        """`hydra.sweep.dir`/`hydra.sweep.subdir` of a point (run_dir_fast: they read nothing of its task config)."""
        if self._numbered_in is not None:
            return self._numbered_in / str(num)
        if self._working is None:
            self._working = copy.deepcopy(self.config)
        working = self._working
        OmegaConf.copy_cache(from_config=self.composer.master, to_config=working)
        with read_write(working.hydra), open_dict(working.hydra):
            working.hydra.job.num = num
            working.hydra.job.override_dirname = override_dirname
        return run_dir_of(working, in_place=True)


@dataclasses.dataclass
class PointRecipe:
    """A point of a sweep: its base (None: compose it in full) and the value overrides applied to it."""

    composer: SweepComposer
    base: _Base | Exception | None
    overrides: list[str]
    values: list[Override]
    task_lines: list[str]
    app_overrides: list[Override] = dataclasses.field(default_factory=list)

    def config(self, num: int) -> DictConfig:
        """The point's config, `hydra` node included: exactly what `load_sweep_config` gives, with its job number."""
        if isinstance(self.base, Exception):
            raise self.base
        if self.base is None:
            config = self.composer.loader.load_sweep_config(self.composer.master, list(self.overrides))
        else:
            config = copy.deepcopy(self.base.config)
            OmegaConf.copy_cache(from_config=self.composer.master, to_config=config)
            apply_overrides(self.values, config)
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.overrides.task = self.base.task_lines_before + self.task_lines
                config.hydra.job.override_dirname = self.override_dirname()
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.job.num = num
        return config

    def override_dirname(self) -> str:
        assert isinstance(self.base, _Base)
        return overrides_dirname(self.app_overrides, **self.base.dirname_settings)

    def resolve(self, num: int) -> tuple[dict[str, Any], Path]:
        """The point's resolved task config (as `run(cfg)` sees it) and its run directory."""
        fast = self._fast_task_config() if isinstance(self.base, _Base) and self.base.run_dir_fast else None
        if fast is not None:
            return fast, self.base.run_dir(num, self.override_dirname())
        config = self.config(num)
        return resolved_task_config(config), run_dir_of(config)

    def _fast_task_config(self) -> dict[str, Any] | None:
        """The base's resolved task config with this point's value overrides applied section by section;
        None where that would not be exactly the job's (interpolations, overrides above a section)."""
        base = self.base
        if base.resolved is None:
            return None
        by_section: dict[str, list[Override]] = {}
        for o in self.values:
            section, dot, rest = o.key_or_group.partition(".")
            # A deletion goes the exact road: applied to a section alone, Hydra's open_dict would be set on
            # the section itself, which lets a typed section (a loss dataclass) lose a field it must refuse.
            if (not dot or not rest or o.package is not None or "$" in (o.input_line or "") or o.is_delete()
                    or not isinstance(base.resolved.get(section), dict)):
                return None
            by_section.setdefault(section, []).append(dataclasses.replace(o, key_or_group=rest))
        task = dict(base.resolved)
        for section, overrides in by_section.items():
            values = base.resolved[section]
            if all(_sets_a_value(o, values) for o in overrides):
                # Only leaves change: on the base's one working copy of the section, set back afterwards.
                node = base.working_section(section)
                try:
                    apply_overrides(overrides, node)
                    task[section] = dict(values)
                    for o in overrides:  # a leaf's value as to_container gives it: no interpolation here
                        task[section][o.key_or_group] = node[o.key_or_group]
                except Exception:  # the exact road reports it with the full key
                    return None
                finally:
                    for o in overrides:
                        node[o.key_or_group] = values[o.key_or_group]
                continue
            # A copy of the section keeps the base as its parent, so it is typed and flagged as there.
            node = copy.deepcopy(raw_node(base.task, section))
            try:
                apply_overrides(overrides, node)
            except Exception:  # the exact road reports it with the full key
                return None
            task[section] = OmegaConf.to_container(node, resolve=True)
        return task


def _sets_a_value(override: Override, section: dict[str, Any]) -> bool:
    """A plain `section.key=value` of a key the section has, whose value and new value are not containers."""
    key, value = override.key_or_group, override.value()
    return (override.type == OverrideType.CHANGE and "." not in key and key in section
            and not isinstance(section[key], (dict, list)) and not isinstance(value, (dict, list)))


class _HydraConfigAs:
    """Make `${hydra:...}` resolve against one job's config for a moment (the job process does the same).
    `in_place`: read the config's own hydra node (as set_config's copy of it would read), without copying it."""

    def __init__(self, config: DictConfig, in_place: bool = False):
        self.config = config
        self.in_place = in_place

    def __enter__(self) -> None:
        self.saved = HydraConfig.instance().cfg
        if self.in_place:
            HydraConfig.instance().cfg = self.config
        else:
            HydraConfig.instance().set_config(self.config)

    def __exit__(self, *exc: object) -> None:
        HydraConfig.instance().cfg = self.saved


def resolved_task_config(config: DictConfig) -> dict[str, Any]:
    """The task config `hydra.core.utils.run_job` hands the task function (no hydra node), resolved."""
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    with _HydraConfigAs(config):
        container = OmegaConf.to_container(task, resolve=True)
    assert isinstance(container, dict)
    return container


def run_dir_of(config: DictConfig, in_place: bool = False) -> Path:
    """`hydra.sweep.dir`/`hydra.sweep.subdir`, as hydra.core.utils.run_job joins them."""
    with _HydraConfigAs(config, in_place):
        sweep_dir = str(OmegaConf.select(config, "hydra.sweep.dir"))
        subdir = str(OmegaConf.select(config, "hydra.sweep.subdir"))
    return Path(sweep_dir) / subdir
