"""Registers the launchers and sweepers of `launchers/` with Hydra.

Hydra instantiates a launcher or sweeper only from a class inside the `hydra_plugins` namespace
package (and finds them by scanning it), so `conf/hydra/launcher/*.yaml` and
`conf/hydra/sweeper/grid.yaml` name the classes below; the code lives in `launchers/`.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from launchers.grid_sweeper import GridSweeper as _GridSweeper
from launchers.local import LocalLauncher as _LocalLauncher
from launchers.optuna_sweeper import OptunaSweeper as _OptunaSweeper
from launchers.optuna_sweeper import register_optuna_config
from launchers.slurm.launcher import SlurmLauncher as _SlurmLauncher


class LocalLauncher(_LocalLauncher):
    """`hydra/launcher=local`: launchers/local.py."""


class SlurmLauncher(_SlurmLauncher):
    """`hydra/launcher=slurm`: launchers/slurm/launcher.py."""


class GridSweeper(_GridSweeper):
    """`hydra/sweeper=grid`: launchers/grid_sweeper.py."""


class OptunaSweeper(_OptunaSweeper):
    """`hydra/sweeper=optuna`: launchers/optuna_sweeper.py."""


class DpoSweepsConfigs(SearchPathPlugin):
    """Makes `hydra/sweeper=optuna` this project's Optuna config (launchers/optuna_sweeper.py).

    Done when Hydra sets up its search path, after it has imported every plugin: a registration at
    import time would be overwritten by hydra-optuna-sweeper's own, imported after this module.
    (A yaml file of that name cannot replace it: Hydra refuses a yaml that shadows a structured
    config with a defaults list.)
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        register_optuna_config()
