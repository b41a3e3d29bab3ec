"""The behaviour dpo-sweeps relies on in Hydra's and OmegaConf's private API (launchers/hydra_private.py),
one test per borrowed name, so that a release that changes one fails here, by name, before the sweeps
built on it (tests/unit/test_compose.py) fail somewhere less clear; and no private name used outside the
fence."""

from __future__ import annotations

import ast
import re

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from omegaconf import MISSING, OmegaConf
from support import REPO

from dpo_sweeps.launchers.hydra_private import (
    BasicSweeper,
    apply_overrides,
    config_group_test,
    overrides_dirname,
    raw_node,
)

FENCE = REPO / "launchers" / "hydra_private.py"


@pytest.fixture(scope="module")
def loader() -> ConfigLoaderImpl:
    return ConfigLoaderImpl(config_search_path=create_config_search_path(str(REPO / "conf")))


def parsed(*overrides: str):
    return OverridesParser.create().parse_overrides(list(overrides))


def test_apply_overrides_to_config_changes_adds_forces_and_deletes_in_order():
    config = OmegaConf.create({"a": {"b": 1, "d": 4, "gone": 0}})
    apply_overrides(parsed("a.b=2", "+a.c=3", "++a.d=5", "++a.e=6", "~a.gone", "a.b=7"), config)
    assert OmegaConf.to_container(config) == {"a": {"b": 7, "d": 5, "c": 3, "e": 6}}


def test_apply_overrides_to_config_refuses_a_missing_key_and_an_existing_plus():
    config = OmegaConf.create({"a": {"b": 1}})
    OmegaConf.set_struct(config, True)  # as Hydra leaves a composed config
    with pytest.raises(ConfigCompositionException, match="a.zz"):
        apply_overrides(parsed("a.zz=1"), config)
    with pytest.raises(ConfigCompositionException, match="a.b"):
        apply_overrides(parsed("+a.b=2"), config)


def test_apply_overrides_to_config_keeps_a_typed_node_typed():
    """compose.py applies a point's values to a typed section copy: a wrong type must still be refused."""
    from dataclasses import dataclass

    @dataclass
    class Section:
        size: int = MISSING

    config = OmegaConf.create({"s": OmegaConf.structured(Section(size=1))})
    apply_overrides(parsed("s.size=3"), config)
    assert config.s.size == 3
    with pytest.raises(ConfigCompositionException, match="s.size"):
        apply_overrides(parsed("s.size=abc"), config)


def test_get_overrides_dirname_sorts_excludes_and_joins():
    found = overrides_dirname(parsed("b=2", "a=1", "train.seed=3"), kv_sep="=", item_sep=",",
                              exclude_keys=["train.seed"])
    assert found == "a=1,b=2"
    assert overrides_dirname(parsed("loss.beta=0.5"), kv_sep=":", item_sep="_", exclude_keys=[]) == "loss.beta:0.5"


def test_parse_overrides_and_create_caching_repo_tells_groups_from_keys(loader):
    is_group = config_group_test(loader, "config", [])
    assert is_group("model") and is_group("fsdp") and is_group("hydra/launcher")
    assert not is_group("train") and not is_group("no_such_group")


def test_dictconfig_get_node_keeps_interpolations_and_the_parent():
    config = OmegaConf.create({"a": {"x": 1, "y": "${a.x}"}, "b": 2})
    node = raw_node(config, "a")
    assert OmegaConf.to_container(node, resolve=False) == {"x": 1, "y": "${a.x}"}
    assert node._get_parent() is config  # a copy of it resolves against the whole config, as compose needs
    assert node.y == 1


def test_basic_sweeper_expands_a_grid_in_hydras_order():
    points = [point for batch in BasicSweeper.split_arguments(parsed("a=1,2", "b=x,y"), None) for point in batch]
    assert points == [["a=1", "b=x"], ["a=1", "b=y"], ["a=2", "b=x"], ["a=2", "b=y"]]


def test_no_private_hydra_or_omegaconf_name_outside_the_fence():
    """`hydra._internal` and underscore names of Hydra's or OmegaConf's objects appear in hydra_private.py only."""
    private = re.compile(r"\b(_apply_overrides_to_config|_parse_overrides_and_create_caching_repo|_get_node|"
                         r"get_overrides_dirname)\b")
    offenders = []
    for root in ("dpo_sweeps", "launchers", "analysis", "hydra_plugins"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path.resolve() == FENCE.resolve() or path.is_symlink():
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                module = getattr(node, "module", None) if isinstance(node, ast.ImportFrom) else None
                names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
                if (module or "").startswith("hydra._internal") or any(n.startswith("hydra._internal") for n in names):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} imports hydra._internal")
                if isinstance(node, ast.Attribute) and private.fullmatch(node.attr):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} uses .{node.attr}")
    assert not offenders, "private Hydra/OmegaConf API outside launchers/hydra_private.py:\n" + "\n".join(offenders)
