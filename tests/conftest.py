"""Fixtures shared by tests/unit and tests/integration (helpers live in tests/support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import HH_PATH


@pytest.fixture
def hh_path() -> Path:
    if not HH_PATH.exists():
        pytest.fail(f"the HH-RLHF test split is expected at {HH_PATH} (../shared/data beside the repository)")
    return HH_PATH
