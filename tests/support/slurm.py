"""Bring up (or reuse) the local SLURM cluster for tests.

`ensure_slurm_cluster(nodes)` returns the environment variables that point SLURM clients
(sbatch, srun, sacct, submitit) at the cluster of launchers/slurm/local_cluster.sh,
starting it first if it is not up or has fewer than `nodes` nodes. It starts CLUSTER_NODES (2)
nodes whatever a test asks, so that one cluster serves every SLURM test of a session (one-node
jobs run on a two-node cluster as well) and none is restarted under a running one. Where it
cannot be started (not root, no apt-get), the calling test is skipped, except under CI
(CI=true), where that is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from dpo_sweeps.rundir.checkpoints import latest_checkpoint
from support import isolation

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "launchers" / "slurm" / "local_cluster.sh"
DEFAULT_STATE_DIR = "/tmp/dpo-sweeps-slurm"
STATE_DIR_ENV = "DPO_SWEEPS_SLURM_STATE_DIR"
NODES_ENV = "DPO_SWEEPS_SLURM_NODES"
# The nodes a cluster started by the tests has (DPO_SWEEPS_SLURM_NODES in the environment overrides).
CLUSTER_NODES = 2
SLURM_BINARIES = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "sbatch", "sacct")

_cached: dict[str, str] | None = None


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"local SLURM cluster unavailable under CI: {reason}", pytrace=False)
    pytest.skip(f"local SLURM cluster unavailable: {reason}")


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # The cluster's daemons and database outlive this test session: they get the user's environment, not
    # the session's temporary folders (tests/support/isolation.py), which go when the session ends.
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=isolation.start().service_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"export (\w+)='([^']*)'", line.strip())
        if m:
            env[m.group(1)] = m.group(2)
    if "SLURM_CONF" not in env:
        pytest.fail(f"{path} does not export SLURM_CONF", pytrace=False)
    return env


def _have_binaries() -> bool:
    extra = os.pathsep.join(("/usr/sbin", "/sbin"))
    path = os.environ.get("PATH", "") + os.pathsep + extra
    return all(shutil.which(b, path=path) for b in SLURM_BINARIES)


def _nodes_of(env: dict[str, str]) -> int:
    return int(env.get(NODES_ENV) or 1)  # env.sh of a cluster started before --nodes existed: one node


def ensure_slurm_cluster(nodes: int = 1) -> dict[str, str]:
    """Return env vars (SLURM_CONF, ...) for a local cluster of at least `nodes` nodes, starting it if needed."""
    global _cached
    if _cached is not None and _nodes_of(_cached) >= nodes:
        return dict(_cached)
    state_dir = os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    env_file = Path(state_dir) / "env.sh"

    # Already up (e.g. started by CI or by a contributor): no root needed to use it.
    if SCRIPT.exists() and env_file.exists() and shutil.which("sbatch"):
        status = _run("status", state_dir, timeout=60)
        if status.returncode == 0 and _nodes_of(_read_env_file(env_file)) >= nodes:
            _cached = _read_env_file(env_file)
            return dict(_cached)

    if os.name != "posix" or not hasattr(os, "geteuid") or os.geteuid() != 0:
        _unavailable("it is not running and starting it needs root")
    if not _have_binaries() and shutil.which("apt-get") is None:
        _unavailable("SLURM is not installed and apt-get is not available")

    start_nodes = str(max(nodes, int(os.environ.get(NODES_ENV) or CLUSTER_NODES)))
    for step, timeout in ((("install",), 900), (("start", "--nodes", start_nodes, state_dir), 300)):
        try:
            proc = _run(*step, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`local_cluster.sh {' '.join(step)}` took over {timeout} s", pytrace=False)
        if proc.returncode != 0:
            pytest.fail(
                f"`local_cluster.sh {' '.join(step)}` failed (rc={proc.returncode}):\n"
                f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}",
                pytrace=False,
            )
    _cached = _read_env_file(env_file)
    if _nodes_of(_cached) < nodes:
        pytest.fail(f"the local SLURM cluster has {_nodes_of(_cached)} node(s) after start; {nodes} wanted", pytrace=False)
    return dict(_cached)


# ---------------------------------------------------------------------- driving a sweep's SLURM jobs
def slurm(*args: str, env: dict) -> str:
    """A SLURM client command's stdout (squeue, scancel, scontrol, ...), failing the test if it fails."""
    return subprocess.run(args, env=env, capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def wait_for(what: str, condition, proc: subprocess.Popen, log: Path, timeout: float):
    """condition()'s first true value, polled while the sweep `proc` (its output in `log`) runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended while waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def checkpoint_after(run_dir: Path, step: int) -> int | None:
    """The step of run_dir's newest checkpoint when it is later than `step`, else None."""
    latest = latest_checkpoint(run_dir)
    return latest.step if latest is not None and latest.step > step else None


# ---------------------------------------------------------------------- the batch script of one run
def compose_slurm_job(tmp_path: Path, *overrides: str):
    """The SLURM launcher and the SweepJob of one run composed from conf/ (nothing is submitted)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from dpo_sweeps.launchers.jobs import SweepJob

    overrides = ("hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path}", *overrides)
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    task_config = OmegaConf.to_container(cfg, resolve=False)
    task_config.pop("hydra")
    job = SweepJob(num=0, overrides=list(overrides), config=cfg, task_config=task_config, config_hash="",
                   run_dir=tmp_path / "0")
    return launcher, job


def sbatch_script(tmp_path: Path, launcher, job) -> str:
    """The batch script submitit would hand to sbatch for `job` (no job is submitted)."""
    import submitit

    parameters = launcher.executor_parameters(launcher._shape(job))  # refusals come before submitit looks for srun
    executor = submitit.AutoExecutor(cluster="slurm", folder=tmp_path / ".submitit" / "%j")
    executor.update_parameters(**parameters)
    return executor._executor._make_submission_file_text("python -m submitit.core._submit", "uid")
