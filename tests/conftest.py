"""Fixtures shared by tests/unit and tests/integration (helpers live in tests/support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import HH_PATH
from support.reports import grid_sweep


@pytest.fixture
def hh_path() -> Path:
    if not HH_PATH.exists():
        pytest.fail(f"the HH-RLHF test split is expected at {HH_PATH} (../shared/data beside the repository)")
    return HH_PATH


@pytest.fixture
def grid(tmp_path) -> Path:
    """A sample grid sweep's run directories (tests/support/reports.py), as a report reads them."""
    return grid_sweep(tmp_path / "multirun" / "2026-11-30" / "12-00-00")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF file, fetched once (tests/support/smollm2.py)."""
    from support.smollm2 import smollm2_gguf as fetch

    return fetch()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    """SmolLM2's tokenizer and chat template, from the GGUF cache entry or the file (no weights read)."""
    from dpo_sweeps.models.gguf import tokenizer_of

    return tokenizer_of(smollm2_gguf)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`) a test file runs on one worker, so its module-scoped
    fixtures (a fault matrix, a sweep several tests read) run once; and every file with a test on the local
    SLURM cluster runs on one worker, one test at a time: those tests share one cluster, and some of them stop
    its nodes. Without xdist the groups mean nothing and are not added. Known not to work yet: pytest-xdist
    3.8 groups by appending `@group` to `item._nodeid`, which pytest 9.2's `nodeid` no longer reads (with
    pytest 9.0.3 a test marked in `pytest_itemcollected` is grouped; with 9.2.0 not even a module's
    `pytestmark` is), so the full suite is not run under xdist in CI."""
    if not config.pluginmanager.hasplugin("xdist"):
        return

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    on_cluster = {file_of(item) for item in items if item.get_closest_marker("slurm") is not None}
    for item in items:
        item.add_marker(pytest.mark.xdist_group("slurm" if file_of(item) in on_cluster else file_of(item)))
