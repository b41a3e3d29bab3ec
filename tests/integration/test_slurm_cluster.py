"""Real jobs on the local one-node SLURM cluster (launchers/slurm/local_cluster.sh)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

submitit = pytest.importorskip("submitit")
cloudpickle = pytest.importorskip("cloudpickle")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.slurm import ensure_slurm_cluster  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The job's Python cannot import this test module (tests/ is not on its path), so the
# functions below travel by value instead of by reference.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def global_rank() -> int:
    return submitit.JobEnvironment().global_rank


def raise_error() -> None:
    raise ValueError("raised on purpose inside a SLURM job")


@pytest.fixture(scope="module")
def slurm_env() -> Iterator[dict[str, str]]:
    env = ensure_slurm_cluster()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env


def test_two_task_job_and_failing_job(slurm_env: dict[str, str], tmp_path: Path) -> None:
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm")
    assert executor.cluster == "slurm"
    executor.update_parameters(
        slurm_partition="debug", tasks_per_node=2, cpus_per_task=1, timeout_min=5
    )
    ranks_job = executor.submit(global_rank)

    executor.update_parameters(tasks_per_node=1)
    failing_job = executor.submit(raise_error)

    # a job with several tasks returns one result per task: results(), not result()
    assert ranks_job.results() == [0, 1]

    with pytest.raises(submitit.core.utils.FailedJobError) as excinfo:
        failing_job.result()
    assert "raised on purpose" in str(excinfo.value)
