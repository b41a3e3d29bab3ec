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
