"""Everything dpo-sweeps borrows from Hydra's and OmegaConf's private API, and nothing else.

Hydra's public plugin API (Sweeper, Launcher, `hydra.core.utils.run_job`, JobReturn, Singleton, the
override parser) is used where it is needed. What is private (`hydra._internal`, names with a leading
underscore) is used only here, one function per borrowed name, each saying what the project needs it
for, so that a Hydra or OmegaConf release that changes one fails in one place:
tests/unit/test_hydra_private.py pins the behaviour each function relies on, test by test under the
borrowed name, and refuses a private name used anywhere else in the package. pyproject pins
hydra-core to 1.3.x; a new minor release is checked against those tests before the pin moves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# Hydra's basic sweeper, subclassed by the grid sweeper (grid_sweeper.py) for its `setup` (the config
# loader and launcher a sweeper is given) and `split_arguments` (a sweep's overrides expanded into the
# grid's points, in Hydra's order). Hydra ships it as a core plugin but under `_internal`.
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig

__all__ = ["BasicSweeper", "apply_overrides", "config_group_test", "overrides_dirname", "raw_node"]


def apply_overrides(overrides: Sequence[Override], config: DictConfig) -> None:
    """Apply value overrides (`a.b=1`, `+a.c=2`, `++a.d=3`, `~a.b`) to a composed config in place, as
    Hydra does after composing the defaults tree; compose.py applies a point's value overrides to a base
    composed once for all the points that share their config-group choices.
    Borrowed: `ConfigLoaderImpl._apply_overrides_to_config` (hydra._internal.config_loader_impl)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(list(overrides), config)


def overrides_dirname(overrides: Sequence[Override], *, kv_sep: str, item_sep: str,
                      exclude_keys: Sequence[str]) -> str:
    """`hydra.job.override_dirname` of a point, as Hydra computes it for a job it composes itself; the
    run directory of a sweep often interpolates it.
    Borrowed: `get_overrides_dirname` (hydra._internal.config_loader_impl)."""
    from hydra._internal.config_loader_impl import get_overrides_dirname

    return get_overrides_dirname(overrides=list(overrides), exclude_keys=list(exclude_keys), item_sep=item_sep,
                                 kv_sep=kv_sep)


def config_group_test(config_loader: Any, config_name: str | None,
                      hydra_overrides: Sequence[str]) -> Callable[[str], bool]:
    """Whether a key names a config group (`model`, `hydra/launcher`) in the search path the sweep's own
    hydra overrides give: compose.py sorts a point's overrides into group choices (a new composition) and
    value overrides (applied to a shared one) with it.
    Borrowed: `ConfigLoaderImpl._parse_overrides_and_create_caching_repo` and the `group_exists` of the
    repository it returns (hydra._internal.config_repository.CachingConfigRepository)."""
    _, repository = config_loader._parse_overrides_and_create_caching_repo(config_name, list(hydra_overrides))
    return repository.group_exists


def raw_node(config: DictConfig, key: str) -> Any:
    """The node under `key` itself, not its value: its interpolations unresolved, its type and flags and
    its parent kept, so that a copy of one section of a composed config can take overrides as the whole
    config would (compose.py's section-by-section road).
    Borrowed: `DictConfig._get_node` (OmegaConf)."""
    return config._get_node(key)
