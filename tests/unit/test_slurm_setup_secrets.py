"""A SLURM setup line's secret travels by environment (launchers/slurm/launcher.py, secrets_by_environment):
the rewritten line holds none, and bash expands it to what the line the user wrote expands to, whether the
secret stood unquoted, in double quotes or in single quotes."""

from __future__ import annotations

import os
import subprocess

import pytest

from dpo_sweeps.launchers.slurm.launcher import secrets_by_environment

PASSWORD = "pw-7f3a9c11"


@pytest.mark.parametrize("line", [
    f"printf %s postgresql://alice:{PASSWORD}@db/app",
    f'printf %s "postgresql://alice:{PASSWORD}@db/app"',
    f"printf %s 'postgresql://alice:{PASSWORD}@db/app'",
    f"printf %s 'Authorization: Bearer {PASSWORD}' 'and ?token={PASSWORD}'",
    "printf %s 'no secret here'",
])
def test_the_job_expands_the_line_it_was_given(line, monkeypatch):
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the variables it sets stay in this test
    rewritten = secrets_by_environment(line)
    assert PASSWORD not in rewritten
    expand = [subprocess.run(["bash", "-c", text], capture_output=True, text=True, env=os.environ, check=True).stdout
              for text in (line, rewritten)]
    assert expand[0] == expand[1]
