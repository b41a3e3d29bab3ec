"""Registers the launchers and sweepers of `dpo_sweeps.launchers` (launchers/) with Hydra.

Hydra instantiates a launcher or sweeper only from a class inside the `hydra_plugins` namespace
package (and finds them by scanning it), so `conf/hydra/launcher/*.yaml` and
`conf/hydra/sweeper/{grid,optuna}.yaml` name the classes below; the code lives in `launchers/`.
Nothing heavy is imported here: Hydra imports every plugin whenever any Hydra app starts.
"""

import importlib.util
import sys

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from dpo_sweeps.launchers.grid_sweeper import GridSweeper as _GridSweeper
from dpo_sweeps.launchers.local import LocalLauncher as _LocalLauncher
from dpo_sweeps.launchers.optuna_sweeper import OptunaSweeper as _OptunaSweeper
from dpo_sweeps.launchers.slurm.launcher import SlurmLauncher as _SlurmLauncher


class LocalLauncher(_LocalLauncher):
    """`hydra/launcher=local`: launchers/local.py."""


class SlurmLauncher(_SlurmLauncher):
    """`hydra/launcher=slurm`: launchers/slurm/launcher.py."""


class GridSweeper(_GridSweeper):
    """`hydra/sweeper=grid`: launchers/grid_sweeper.py."""


class OptunaSweeper(_OptunaSweeper):
    """`hydra/sweeper=optuna`: launchers/optuna_sweeper.py."""


class StalePluginCheck(SearchPathPlugin):
    """Says so when hydra-optuna-sweeper is still installed (an older dpo-sweeps needed it): its own
    `hydra/sweeper=optuna` and sampler configs would shadow conf/hydra/sweeper/'s, for optuna<3."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is not None:
            print("warning: hydra-optuna-sweeper is installed and shadows hydra/sweeper=optuna's configs "
                  "(conf/hydra/sweeper/); run: pip uninstall hydra-optuna-sweeper", file=sys.stderr)
