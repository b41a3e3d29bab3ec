"""How a sweep's runs get onto devices: Hydra launchers and sweepers for dpo-sweeps (`dpo_sweeps.launchers`:
this folder, linked into the package as dpo_sweeps/launchers, so that an install has no top-level `launchers`).

- `dpo_sweeps.launchers.local.LocalLauncher` (`hydra/launcher=local`, the default): jobs on this machine,
  as many at once as its CPU cores or GPUs hold, each on its own cores / GPUs, one process per rank.
- `dpo_sweeps.launchers.slurm.launcher.SlurmLauncher` (`hydra/launcher=slurm`): one SLURM job per run, one task
  per rank, on `resources.nodes` nodes.
- `dpo_sweeps.launchers.grid_sweeper.GridSweeper` (`hydra/sweeper=grid`, the default): the grid, checked
  whole before launch (`preflight`), resumed by config hash (`resume`), summed up at the end
  (`outcome`).
- `dpo_sweeps.launchers.optuna_sweeper.OptunaSweeper` (`hydra/sweeper=optuna`): an Optuna search with
  hydra-optuna-sweeper's keys (`optuna_space`, `optuna_sampler`), asynchronous trials (`optuna_loop`,
  `trial_slots`), the study in the sweep directory or any shared storage, trials checked before launch.
`jobs` composes one point of a sweep as its job will (`compose`: one Hydra composition per choice of
config groups, each point's values applied to it); `placement` gives local jobs their devices.

Hydra loads plugins only from the `hydra_plugins` namespace: hydra_plugins/dpo_sweeps_launchers
registers these classes there. `launchers/slurm/local_cluster.sh` brings up a one-node SLURM
cluster for tests and contributors (a checkout's script: installs do not carry it).
"""
