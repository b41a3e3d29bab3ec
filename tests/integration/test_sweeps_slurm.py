"""Sweeps on the local one-node SLURM cluster (launchers/slurm/local_cluster.sh): `hydra/launcher=slurm`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import require_tcmalloc  # noqa: E402
from support.slurm import ensure_slurm_cluster  # noqa: E402
from support.sweeps import COMPLETED_RUN_FORM, PROBE_RUN_FORM, run_dir_form, run_sweep  # noqa: E402

ON_SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=10",
            "hydra.launcher.poll_interval_s=1"]


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    return ensure_slurm_cluster()


@pytest.mark.slow
@pytest.mark.slurm
def test_four_job_sweep_runs_as_slurm_jobs_of_two_tasks(slurm_env, tmp_path):
    sweep_dir = tmp_path / "sweep"
    grid = ["fsdp=full_shard,shard_grad_op", "precision=fp32,bf16", "resources.nproc_per_node=2", "train.max_steps=4"]
    result = run_sweep(sweep_dir, *ON_SLURM, *grid, env=slurm_env)
    assert result.returncode == 0, result.output[-3000:]
    slurm_jobs = re.findall(r"#(\d) submitted: .*\(1 node\(s\) x 2 tasks; SLURM job (\d+_\d)\)", result.output)
    assert sorted(n for n, _ in slurm_jobs) == ["0", "1", "2", "3"]
    for n in range(4):
        summary = result.summary(n)
        assert summary["status"] == "completed" and summary["metrics"]["world_size"] == 2
        assert run_dir_form(sweep_dir / str(n)) == COMPLETED_RUN_FORM  # as a local sweep's runs
    # Each task (rank) of a job logged to its own submitit file; rank 1 wrote nothing in the run dir.
    job_id = slurm_jobs[0][1]
    assert (sweep_dir / ".submitit" / job_id / f"{job_id}_1_log.out").exists()

    again = run_sweep(sweep_dir, *ON_SLURM, *grid, env=slurm_env)
    assert again.returncode == 0, again.output[-3000:]
    assert "4 of 4 runs already completed" in again.output and "submitted" not in again.output


@pytest.mark.slow
@pytest.mark.slurm
def test_a_slurm_jobs_tasks_run_with_the_malloc_its_run_asks_for(slurm_env, tmp_path):
    """srun starts the tasks, not dpo-sweeps: the job's batch script exports tcmalloc for the runs that ask,
    and for auto's (CPU jobs of several tasks, the library installed where the sweep submits)."""
    require_tcmalloc()
    sweep_dir = tmp_path / "sweep"
    result = run_sweep(sweep_dir, *ON_SLURM, "resources.cpu_allocator=auto,glibc,tcmalloc",
                       "resources.nproc_per_node=2", "train.max_steps=2", env=slurm_env)
    assert result.returncode == 0, result.output[-3000:]
    for n, allocator in enumerate(("tcmalloc", "glibc", "tcmalloc")):
        summary = result.summary(n)
        assert summary["status"] == "completed" and summary["metrics"]["world_size"] == 2
        assert summary["layout"]["cpu_allocator"] == allocator


@pytest.mark.slow
@pytest.mark.slurm
def test_probes_of_one_shape_share_a_slurm_job_when_asked(slurm_env, tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = run_sweep(sweep_dir, *ON_SLURM, "hydra.launcher.probes_per_job=2", "fsdp=full_shard,shard_grad_op",
                       "resources.nproc_per_node=2", "probe.steps=3", "perf.warmup_steps=1", env=slurm_env)
    assert result.returncode == 0, result.output[-3000:]
    assert re.search(r"#0, #1 submitted: .*\(1 node\(s\) x 2 tasks; SLURM job \d+\)", result.output), result.output
    for n in range(2):
        summary = result.summary(n)
        assert summary["status"] == "completed" and summary["metrics"]["probe/steps"] == 3
        assert summary["metrics"]["world_size"] == 2
        assert run_dir_form(sweep_dir / str(n)) == PROBE_RUN_FORM


@pytest.mark.slow
@pytest.mark.slurm
def test_a_rank_killed_on_slurm_fails_its_job_with_the_rank_named(slurm_env, tmp_path):
    result = run_sweep(tmp_path / "sweep", *ON_SLURM, "resources.nproc_per_node=2", "train.max_steps=4",
                       "faults.kind=sigkill", "faults.step=2", "faults.rank=1", env=slurm_env)
    assert result.returncode != 0
    failure = result.summary(0)["failure"]
    assert failure["kind"] == "crash"
    assert failure["message"].startswith("rank 1 ended abruptly"), failure
    assert "failed     1  (crash: 1)" in result.stdout


@pytest.mark.slow
@pytest.mark.slurm
def test_optuna_trials_run_as_slurm_jobs(slurm_env, tmp_path):
    optuna = pytest.importorskip("optuna")
    sweep_dir = tmp_path / "study"
    result = run_sweep(sweep_dir, *ON_SLURM, "hydra/sweeper=optuna", "+sweep=optuna_dpo", "hydra.sweeper.n_trials=2",
                       "hydra.sweeper.n_jobs=2", "train.max_steps=4", env=slurm_env)
    assert result.returncode == 0, result.output[-3000:]
    assert len(re.findall(r"#\d submitted: .*2 tasks; SLURM job", result.output)) == 2
    study = optuna.load_study(study_name="dpo_sweeps", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert [result.summary(n)["metrics"]["world_size"] for n in range(2)] == [2, 2]


@pytest.mark.slow
@pytest.mark.slurm
def test_a_job_sbatch_refuses_is_recorded_failed_with_the_reason(slurm_env, tmp_path):
    # device=cpu: under auto the launcher asks sinfo about the partition first and refuses the sweep
    # before launch (tests/integration/test_gpu_launch.py); here the job must reach sbatch.
    result = run_sweep(tmp_path / "sweep", *ON_SLURM, "hydra.launcher.partition=no_such_partition",
                       "resources.device=cpu", "train.max_steps=2", env=slurm_env)
    assert result.returncode != 0
    failure = result.summary(0)["failure"]
    assert failure["kind"] == "crash" and failure["message"].startswith("sbatch refused the job:")
    assert "invalid partition" in failure["message"].lower(), failure
    assert "failed     1  (crash: 1)" in result.stdout


def test_sbatch_script_takes_each_runs_shape_and_the_launcher_settings(tmp_path):
    """No cluster needed: the batch script submitit would hand to sbatch for a 2-node GPU run."""
    pytest.importorskip("submitit")
    from support.slurm import compose_slurm_job, sbatch_script

    overrides = ["hydra.launcher.partition=gpu",
                 "hydra.launcher.account=dpo", "hydra.launcher.qos=high", "hydra.launcher.timeout_min=90",
                 "hydra.launcher.cpus_per_task=10", "+hydra.launcher.additional_parameters.reservation=dpo-week",
                 "hydra.launcher.setup=[module load cuda/12.4]",
                 "hydra.launcher.srun_args=['--kill-on-bad-exit=1','--cpu-bind=cores']",
                 "resources.device=cuda", "resources.nodes=2", "resources.nproc_per_node=8", "fsdp=hybrid_shard"]
    launcher, job = compose_slurm_job(tmp_path, *overrides)
    assert launcher.describe_job(job) == "2 nodes x 8 tasks, 8 GPUs/node"

    script = sbatch_script(tmp_path, launcher, job)
    for line in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--partition=gpu", "--account=dpo",
                 "--qos=high", "--time=90", "--cpus-per-task=10", "--reservation=dpo-week", "--job-name=dpo_sweeps"):
        assert f"#SBATCH {line}" in script, line
    assert "module load cuda/12.4" in script
    assert re.search(r"^srun .* --kill-on-bad-exit=1 --cpu-bind=cores ", script, flags=re.M)


SETUP_PASSWORD = "Hunter2-pw-7f3a9c"


@pytest.mark.slow
@pytest.mark.slurm
def test_a_password_in_a_slurm_setup_line_reaches_the_job_and_no_file(slurm_env, tmp_path):
    """A setup line that exports a service's URL with its password (a SLURM-side service): the batch script
    submitit writes holds an environment variable's expansion instead, the job sees the password (its
    second setup line exits the job unless the URL is whole), and no file of the sweep holds it."""
    url = f"postgresql://alice:{SETUP_PASSWORD}@127.0.0.1:1/db"
    sweep_dir = tmp_path / "sweep"
    setup = f"hydra.launcher.setup=['export DPO_TEST_DB={url}','test \"$DPO_TEST_DB\" = {url} || exit 3']"
    result = run_sweep(sweep_dir, *ON_SLURM, setup,
                       "resources.nproc_per_node=1", "train.max_steps=2", env=slurm_env)
    assert result.returncode == 0, result.output[-3000:]
    assert result.summary(0)["status"] == "completed"
    (script,) = sweep_dir.glob(".submitit/*/*_submission.sh")
    assert "DPO_SWEEPS_SETUP_" in script.read_text()
    assert SETUP_PASSWORD not in result.output
    assert not [p for p in sweep_dir.rglob("*") if p.is_file() and SETUP_PASSWORD.encode() in p.read_bytes()]
