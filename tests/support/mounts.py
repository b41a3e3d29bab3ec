"""Small file systems for the tests of full and read-only disks: a tmpfs mounted for the test's length."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(mount: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of `size` at `mount` (made if absent), unmounted afterwards. Root only, as CI runs the tests:
    a failed mount fails the test rather than skipping what it checks."""
    mount.mkdir(parents=True, exist_ok=True)
    up = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                        capture_output=True, text=True)
    if up.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs at {mount} ({up.stderr.strip()}): the disk tests run as root, as CI does")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
