"""SLURM: the `hydra/launcher=slurm` launcher, and (local_cluster.sh) a one-node cluster for tests."""

from dpo_sweeps.launchers.slurm.launcher import SlurmLauncher

__all__ = ["SlurmLauncher"]
