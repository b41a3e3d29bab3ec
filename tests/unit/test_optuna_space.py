"""The Optuna sweeper's search space reads hydra-optuna-sweeper's documented override syntax."""

import optuna
import pytest

from dpo_sweeps.launchers.optuna_space import SearchSpace, SearchSpaceError

optuna.logging.set_verbosity(optuna.logging.WARNING)


def dims(*overrides, params=None):
    return SearchSpace.parse(params, list(overrides)).dimensions


def test_the_plugins_documented_overrides_become_these_distributions():
    # The plugin's docs (website/docs/plugins/optuna_sweeper.md): its example config and each override kind.
    d = dims(params={"x": "range(-5.5, 5.5, step=0.5)", "y": "choice(-5 ,0 ,5)"})
    assert (d["x"].kind, d["x"].low, d["x"].high, d["x"].step) == ("float", -5.5, 5.0, 0.5)
    assert (d["y"].kind, d["y"].choices) == ("categorical", (-5, 0, 5))
    d = dims("x=int(interval(-5.0, 5.0))", "y=tag(log, interval(1, 10))")
    assert (d["x"].kind, d["x"].low, d["x"].high, d["x"].log) == ("int", -5, 5, False)
    assert (d["y"].kind, d["y"].low, d["y"].high, d["y"].log) == ("float", 1.0, 10.0, True)
    d = dims("x=range(-5.0, 5.0)", "y=shuffle(range(-5, 5))")
    assert (d["x"].kind, d["x"].low, d["x"].high) == ("float", -5.0, 4.0)
    assert d["y"].choices == tuple(range(-5, 5))  # sorted: a continued study sees the same distribution
    d = dims("x=choice(-5.0, 0.0, 5.0)", "y=choice(0, 1, 2, 3, 4, 5)")
    assert d["x"].choices == (-5.0, 0.0, 5.0) and d["y"].choices == (0, 1, 2, 3, 4, 5)


def test_range_means_what_hydra_range_means_under_every_sampler():
    # Hydra's range(1, 4) is 1, 2, 3: TPE draws from the same values the grid visits.
    d = dims("train.micro_batch_size=range(1, 4)")["train.micro_batch_size"]
    assert (d.low, d.high, d.grid_values()) == (1, 3, [1, 2, 3])


def test_the_command_line_wins_over_params_and_fixed_overrides_pass_through():
    space = SearchSpace.parse({"loss.beta": "interval(0.1, 0.2)", "train.lr": "choice(0.1)"},
                              ["loss.beta=choice(0.3, 0.4)", "train.lr=0.01", "+sweep=optuna_dpo", "~wandb.group"])
    assert list(space.dimensions) == ["loss.beta"] and space.dimensions["loss.beta"].choices == (0.3, 0.4)
    assert space.fixed == ["train.lr=0.01", "+sweep=optuna_dpo", "~wandb.group"]


def test_a_trial_gets_its_suggestions_and_the_custom_search_space_as_overrides():
    space = SearchSpace.parse({"train.lr": "tag(log, interval(1e-4, 1e-2))"}, ["train.max_steps=4"],
                              custom_search_space="support.optuna_examples.configure")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    trial = study.ask()
    overrides = space.suggest(trial, config=None)
    lr, beta, tag = trial.params["train.lr"], trial.params["loss.beta"], trial.params["+train.tag_seed"]
    assert overrides == [f"train.lr={lr}", f"loss.beta={beta}", f"+train.tag_seed={tag}", "train.max_steps=4"]
    assert 10 * lr <= beta <= 100 * lr


def test_the_grid_of_the_plugins_grid_test_config():
    # plugins/hydra_optuna_sweeper/tests/conf/test_grid.yaml
    space = SearchSpace.parse({"x": "choice(-1, 1)", "y": "range(-1.0, 1.0, step=1)", "z": 'choice("foo", "bar")'}, [])
    assert space.grid() == {"x": [-1, 1], "y": [-1.0, 0.0], "z": ["foo", "bar"]}


@pytest.mark.parametrize("override, message", [
    ("train.lr=interval(1e-4, 1e-2)", "train.lr: interval(0.0001, 0.01) has no grid"),
    ("train.lr=range(3, 1)", "train.lr: range(3, 1, step=1) is empty"),
])
def test_what_cannot_be_searched_is_refused_naming_the_key(override, message):
    with pytest.raises(SearchSpaceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SearchSpace.parse(None, [override]).grid()


def test_a_sweep_with_nothing_to_search_is_refused():
    with pytest.raises(SearchSpaceError, match="hydra.sweeper.params: nothing to search"):
        SearchSpace.parse(None, ["train.lr=0.01"])


SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler", "nsgaii": "NSGAIISampler",
            "grid": "GridSampler", "qmc": "QMCSampler", "gp": "GPSampler"}


@pytest.mark.parametrize("choice", sorted(SAMPLERS))
def test_every_sampler_config_makes_its_optuna_sampler(choice):
    from omegaconf import OmegaConf
    from support import REPO

    from dpo_sweeps.launchers.optuna_sampler import sampler_factory

    config = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "hydra" / "sweeper" / "sampler" / f"{choice}.yaml"))
    name, make, constrained = sampler_factory(config, {"loss.beta": [0.1, 0.2]}, constrain_memory=True)
    assert name == SAMPLERS[choice] and type(make(0)).__name__ == name
    assert constrained == (choice in ("tpe", "nsgaii", "gp"))  # the samplers that take Optuna's constraints


def draws(seed, first_trials, sampler="RandomSampler"):
    """The first `first_trials` draws of loss.beta in a fresh in-memory study, per-trial-seeded."""
    from dpo_sweeps.launchers.optuna_sampler import trial_seeded_sampler

    make = (lambda s: optuna.samplers.RandomSampler(seed=s)) if sampler == "RandomSampler" else None
    study = optuna.create_study(sampler=trial_seeded_sampler(sampler, make, seed, {}))
    values = []
    for _ in range(first_trials):
        trial = study.ask()
        values.append(trial.suggest_float("loss.beta", 0.01, 1.0))
        study.tell(trial, 0.5)
    return values


def test_trials_are_drawn_from_the_seed_and_their_number_not_one_stream_per_process():
    assert draws(0, 4) == draws(0, 4)  # reproducible
    assert len(set(draws(0, 4))) == 4 and draws(1, 4) != draws(0, 4)


def test_the_points_checked_before_a_study_are_its_choices_combined_with_intervals_at_their_middle():
    from dpo_sweeps.launchers.optuna_space import combinations

    space = SearchSpace.parse(None, ["fsdp=choice(full_shard,hybrid_shard)", "loss.beta=tag(log, interval(0.01, 1.0))",
                                     "train.sample_prompts=range(0, 3, step=2)", "precision=choice(fp32,bf16)",
                                     "faults.step=3"])
    points = space.points(config=None)
    assert sorted(points) == sorted([f"fsdp={f}", "loss.beta=0.1", "train.sample_prompts=2", "precision=" + p,
                                     "faults.step=3"] for f in ("full_shard", "hybrid_shard") for p in ("fp32", "bf16"))
    # The grid sampler's points are its grid; enqueued trials are points too.
    space = SearchSpace.parse(None, ["fsdp=choice(full_shard)", "train.sample_prompts=range(0, 3, step=2)"])
    grid = space.points(None, grid=space.grid(), enqueued=[{"train.sample_prompts": 2}])
    assert grid == [["fsdp=full_shard", "train.sample_prompts=0"], ["fsdp=full_shard", "train.sample_prompts=2"],
                    ["fsdp=full_shard", "train.sample_prompts=2"]]
    # Past the limit, a sample: every value of every key at least once.
    values = {"loss": [f"l{i}" for i in range(23)], "precision": ["fp32", "bf16", "fp16"]}
    sample = combinations(values, limit=32)
    assert len(sample) == 32 == len({tuple(c.values()) for c in sample})
    assert all({c[k] for c in sample} == set(v) for k, v in values.items())
    assert len(combinations(values, limit=69)) == 69


def test_the_middle_of_an_interval_or_range_is_inside_it_and_on_its_step():
    d = dims("a=interval(0, 1)", "b=range(0.1, 0.6, step=0.25)", "c=int(interval(1, 8))", "e=range(4, 5)")
    assert [d[k].middle() for k in "abce"] == [0.5, 0.35, 5, 4]
    assert dims("x=tag(log, interval(1e-4, 1e-2))")["x"].middle() == pytest.approx(1e-3)


def test_the_forecasts_worst_case_points_take_intervals_and_ranges_at_their_top():
    """A study's forecast prices its worst case at these points (launchers/optuna_loop.py): a key that sets a
    size (batch, length, steps) costs the most at its top."""
    space = SearchSpace.parse(None, ["train.batch_size=choice(16,32)", "data.max_length=int(interval(64, 256))",
                                     "train.lr=tag(log, interval(1e-4, 1e-2))", "train.max_steps=range(10, 40, step=10)"])
    assert sorted(space.points(config=None, at_top=True)) == sorted(
        [f"train.batch_size={b}", "data.max_length=256", "train.lr=0.01", "train.max_steps=30"] for b in (16, 32))
