"""Registers the launchers and sweepers of `launchers/` with Hydra.

Hydra instantiates a launcher or sweeper only from a class inside the `hydra_plugins` namespace
package (and finds them by scanning it), so `conf/hydra/launcher/*.yaml` and
`conf/hydra/sweeper/{grid,optuna}.yaml` name the classes below; the code lives in `launchers/`.
Nothing heavy is imported here: Hydra imports every plugin whenever any Hydra app starts.
"""

from launchers.grid_sweeper import GridSweeper as _GridSweeper
from launchers.local import LocalLauncher as _LocalLauncher
from launchers.optuna_sweeper import OptunaSweeper as _OptunaSweeper
from launchers.slurm.launcher import SlurmLauncher as _SlurmLauncher


class LocalLauncher(_LocalLauncher):
    """`hydra/launcher=local`: launchers/local.py."""


class SlurmLauncher(_SlurmLauncher):
    """`hydra/launcher=slurm`: launchers/slurm/launcher.py."""


class GridSweeper(_GridSweeper):
    """`hydra/sweeper=grid`: launchers/grid_sweeper.py."""


class OptunaSweeper(_OptunaSweeper):
    """`hydra/sweeper=optuna`: launchers/optuna_sweeper.py."""
