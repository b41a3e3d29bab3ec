"""A custom search space in hydra-optuna-sweeper's documented form (its example's `configure`), for
`hydra.sweeper.custom_search_space=support.optuna_examples.configure` in tests/integration/test_optuna*.py."""

from omegaconf import DictConfig


def configure(cfg: DictConfig, trial) -> None:
    """beta near the learning rate's scale, and a key the config does not have yet (`+`)."""
    lr = trial.params["train.lr"]
    trial.suggest_float("loss.beta", 10 * lr, 100 * lr)
    trial.suggest_int("+train.tag_seed", 0, 3)
