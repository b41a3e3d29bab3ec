"""How runs get onto GPUs, checked here on a CPU: the GPUs a SLURM job asks for, the GPU each rank takes,
and one run directory for all the ranks torchrun starts."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist


# ---------------------------------------------------------------------- SLURM: the GPUs a job asks for
def sbatch_script(tmp_path, *overrides: str) -> str:
    """The batch script submitit would hand to sbatch for one 4-rank run (no job is submitted)."""
    from support import slurm

    launcher, job = slurm.compose_slurm_job(tmp_path, "resources.nproc_per_node=4", *overrides)
    return slurm.sbatch_script(tmp_path, launcher, job)


@pytest.mark.parametrize("device,gpus_line", [("cuda", "#SBATCH --gpus-per-node=4"), ("cpu", None)])
def test_slurm_jobs_ask_for_one_gpu_per_rank_exactly_when_the_run_uses_cuda(tmp_path, device, gpus_line):
    script = sbatch_script(tmp_path, f"resources.device={device}")
    assert "#SBATCH --ntasks-per-node=4" in script
    assert [ln for ln in script.splitlines() if "gpus" in ln or "gres" in ln] == ([gpus_line] if gpus_line else [])


def test_slurm_gpus_per_node_set_by_hand_wins_over_the_device(tmp_path):
    script = sbatch_script(tmp_path, "resources.device=auto", "hydra.launcher.gpus_per_node=8")
    assert "#SBATCH --gpus-per-node=8" in script


def test_gpus_of_a_partition_are_read_from_sinfos_generic_resources():
    from dpo_sweeps.launchers.slurm.gpus import gpus_in_gres, partition_gpus

    assert [gpus_in_gres(g) for g in ("(null)", "gpu:8", "gpu:h100:8(S:0-1)", "gpu:a100:4,tmpfs:100G",
                                      "tmpfs:100G,gpu:l40s:2(S:0)", "gpu:1g.10gb:7", "mps:100")] == [0, 8, 8, 4, 2, 7, 0]
    lines = ["cpu*|(null)", "gpu|gpu:h100:8(S:0-1)", "gpu|(null)", "mixed|gpu:a100:4"]
    assert partition_gpus(lines, None) == 0  # the default partition (marked *) has none
    assert partition_gpus(lines, "gpu") == 8  # SLURM places GPU jobs on the nodes that have them
    from dpo_sweeps.errors import InvalidConfig

    with pytest.raises(InvalidConfig, match="hydra.launcher.partition: sinfo lists no partition 'nope'"):
        partition_gpus(lines, "nope")


def test_auto_device_on_slurm_without_an_answer_from_the_cluster_is_refused_with_the_setting(tmp_path, monkeypatch):
    from dpo_sweeps.errors import InvalidConfig

    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # a machine without SLURM's client commands
    with pytest.raises(InvalidConfig, match=r"^resources.device: auto cannot ask SLURM .*accepted: cuda or cpu"):
        sbatch_script(tmp_path, "resources.device=auto")


@pytest.mark.slurm
def test_auto_device_asks_for_no_gpu_on_the_local_cpu_only_cluster(tmp_path, monkeypatch):
    from support.slurm import ensure_slurm_cluster

    for key, value in ensure_slurm_cluster().items():
        monkeypatch.setenv(key, value)
    script = sbatch_script(tmp_path, "resources.device=auto", "hydra.launcher.partition=debug")
    assert "#SBATCH --partition=debug" in script and "gpus" not in script



# ---------------------------------------------------------------------- the GPU of each rank
def test_each_rank_takes_its_own_gpu_whether_it_sees_the_nodes_gpus_or_only_its_own():
    from dpo_sweeps.parallel.distributed import cuda_index

    # torchrun / srun --gpus-per-node: every task sees the node's 8 GPUs.
    assert [cuda_index(rank, 8) for rank in range(8)] == list(range(8))
    # srun --gpus-per-task=1: each task sees only its own GPU, as cuda:0.
    assert [cuda_index(rank, 1) for rank in range(8)] == [0] * 8
    # srun --gpus-per-task=2: each task sees two of its own; either index stays within them.
    assert [cuda_index(rank, 2) for rank in range(4)] == [0, 1, 0, 1]



# ---------------------------------------------------------------------- torchrun: one run directory
AGREE = "from dpo_sweeps.runtime.launch_time import launch_time; import time, sys; time.sleep(float(sys.argv[1])); " \
        "print(launch_time().isoformat())"


def test_ranks_asking_torchruns_store_at_different_times_agree_on_one_launch_time(tmp_path):
    """The agent store that torchrun hosts, stood in for by a real TCPStore; ranks ask 1.5 s apart."""
    import datetime
    import subprocess
    import sys

    from support import REPO, cli_env

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=60))
    env = {**cli_env(), "PYTHONPATH": str(REPO), "TORCHELASTIC_USE_AGENT_STORE": "True",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_RUN_ID": "test"}
    ranks = [subprocess.Popen([sys.executable, "-c", AGREE, delay], env=env, stdout=subprocess.PIPE, text=True)
             for delay in ("0", "1.5")]
    times = [proc.communicate(timeout=120)[0].strip() for proc in ranks]
    assert all(proc.returncode == 0 for proc in ranks)
    assert times[0] == times[1] == store.get("dpo_sweeps/launch_time/test").decode()


@pytest.mark.slow
def test_torchrun_without_hydra_run_dir_writes_one_run_directory(tmp_path):
    import subprocess
    import sys

    from support import QUIET, REPO, cli_env

    from dpo_sweeps.parallel.rank_env import free_port

    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", f"--master_port={free_port()}",
            "-m", "dpo_sweeps", *QUIET, "train.max_steps=2", "train.eval_every=0", "train.batch_size=16",
            "train.micro_batch_size=4", "data.num_train_pairs=64", "data.num_eval_pairs=8"]
    proc = subprocess.run(args, cwd=tmp_path, env={**cli_env(), "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs").glob("*/*")  # outputs/DATE/TIME: one, for both ranks
    assert json.loads((run_dir / "summary.json").read_text())["metrics"]["world_size"] == 2
