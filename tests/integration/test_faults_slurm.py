"""A hung rank of a SLURM job (the local cluster of launchers/slurm/local_cluster.sh): the run ends
with kind `hang` naming the rank and step, and the SLURM job ends (no task left running)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.faults import HANG_BOUND, fault_to_summary, injected_at  # noqa: E402
from support.slurm import ensure_slurm_cluster  # noqa: E402
from support.sweeps import run_sweep  # noqa: E402

ON_SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=10",
            "hydra.launcher.poll_interval_s=1"]
COLLECTIVE_TIMEOUT_S = 120  # HANG_BOUND's


@pytest.mark.slow
@pytest.mark.slurm
def test_a_hung_rank_on_slurm_ends_its_job_with_kind_hang(tmp_path):
    env = ensure_slurm_cluster()
    sweep_dir = tmp_path / "sweep"
    result = run_sweep(sweep_dir, *ON_SLURM, "resources.nproc_per_node=2", "train.max_steps=5", "faults.kind=hang",
                       "faults.step=3", "faults.rank=1", *HANG_BOUND, env=env)
    assert result.returncode != 0
    failure = result.summary(0)["failure"]
    assert (failure["kind"], failure["rank"], failure["step"]) == ("hang", 1, 3), failure
    rank1_log_path = next((sweep_dir / ".submitit").glob("*/*_1_log.out"))
    rank1_log = rank1_log_path.read_text()
    seconds = fault_to_summary(sweep_dir / "0", injected_at(rank1_log, "hang"), "hang (SLURM)",
                               "tests/integration/test_faults_slurm.py::test_a_hung_rank_on_slurm_ends_its_job_with_kind_hang")
    assert seconds < COLLECTIVE_TIMEOUT_S + 30
    job_id = rank1_log_path.parent.name
    running = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True, text=True)
    assert running.stdout.strip() == "", running.stdout  # the job ended: no task of it is left
