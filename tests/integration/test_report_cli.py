"""analysis/report.py as a script, in its own process (tests/unit/test_report.py calls its main())."""

from __future__ import annotations

import subprocess
import sys

from support import REPO


def test_report_runs_as_a_script_from_the_repository_root(grid, tmp_path):
    done = subprocess.run([sys.executable, "analysis/report.py", str(grid), "--out", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Best by perf/speed_per_memory" in done.stdout and (tmp_path / "out" / "report.html").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run([sys.executable, "analysis/report.py", str(empty)], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and "no runs found" in refused.stderr
