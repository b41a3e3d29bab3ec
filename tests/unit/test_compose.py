"""A sweep composes once per choice of config groups (launchers/compose.py), and every point's config
is still exactly what Hydra's own `load_sweep_config` gives: the full config with its hydra node,
the resolved task config, its hash and its run directory."""

from __future__ import annotations

import copy
import itertools
import random

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import setup_globals
from hydra.types import HydraContext, RunMode
from omegaconf import OmegaConf, open_dict, read_write
from support import REPO

from dpo_sweeps.launchers.jobs import JobCompositionError, compose_job
from dpo_sweeps.redaction import scrub_secrets
from dpo_sweeps.rundir.hashing import config_hash
from dpo_sweeps.runtime.launch_time import register_resolver

# A grid mixing every kind of override a point can carry: config group choices, plain values,
# `+` (a key the loss file lacks), `++` (add or replace), `~` (delete), interpolations between task
# keys and the `hydra:` resolvers a job reads.
AXES = [
    ["model=tiny_gpt2", "model=tiny_llama"],
    ["fsdp=full_shard", "fsdp=no_shard"],
    ["loss=dpo", "loss=ipo"],
    ["loss.beta=0.1", "loss.beta=0.5", "++loss.beta=0.3"],
    ["train.seed=0", "train.seed=7"],
    ["train.lr=0.001", "train.lr=1"],
    ["", "+loss.label_smoothing=0.2", "~loss.label_smoothing", "++loss.label_smoothing=0.05"],
    ["", "", "", "data.max_length=${train.batch_size}", "wandb.group=${hydra:job.override_dirname}",
     "wandb.entity=n${hydra:job.num}", "wandb.project=${hydra:runtime.choices.model}"],
    ["", "", "", "", "", "train.batch_size=abc", "train.no_such_key=1", "model=no_such_model"],
]
# Run directories as users set them: Hydra's number, the override dirname, a task key.
SUBDIRS = ["${hydra.job.num}", "${hydra.job.override_dirname}", "s${train.seed}_${hydra:job.num}"]


def master_config(loader: ConfigLoaderImpl, sweep_dir, subdir: str):
    master = loader.load_configuration(
        "config", [f"hydra.sweep.dir={sweep_dir}", f"hydra.sweep.subdir={subdir}",
                   "hydra.job.config.override_dirname.exclude_keys=[train.seed]"], RunMode.MULTIRUN)
    HydraConfig.instance().set_config(master)  # as Hydra's multirun does before the sweeper runs
    return master


def hydra_compose(loader, master, overrides, num):
    """What compose_job did before it shared bases: Hydra's full composition of the point."""
    config = loader.load_sweep_config(master, list(overrides))
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.job.num = num
    saved = HydraConfig.instance().cfg
    try:
        HydraConfig.instance().set_config(config)
        task = copy.deepcopy(config)
        with read_write(task), open_dict(task):
            del task["hydra"]
        task_config = OmegaConf.to_container(task, resolve=True)
        run_dir = f"{OmegaConf.select(config, 'hydra.sweep.dir')}/{OmegaConf.select(config, 'hydra.sweep.subdir')}"
    finally:
        HydraConfig.instance().cfg = saved
    return config, task_config, run_dir


@pytest.mark.parametrize("subdir", SUBDIRS)
def test_points_composed_from_a_shared_base_equal_hydras_own(tmp_path, subdir):
    setup_globals()
    register_resolver()
    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(REPO / "conf")))
    master = master_config(loader, tmp_path / "sweep", subdir)
    context = HydraContext(config_loader=loader, callbacks=None)
    grid = [[o for o in point if o] for point in itertools.product(*AXES)]
    points = random.Random(23).sample(grid, 24)
    failed = 0
    for num, point in enumerate(points):
        try:
            expected = hydra_compose(loader, master, point, num)
        except Exception as exc:
            with pytest.raises(JobCompositionError) as refused:
                compose_job(context, master, point, num)
            assert type(refused.value.__cause__) is type(exc), point
            failed += 1
            continue
        job = compose_job(context, master, point, num)
        config, task_config, run_dir = expected
        assert OmegaConf.to_container(job.config, resolve=False) == OmegaConf.to_container(config, resolve=False), point
        assert job.task_config == task_config, point
        assert str(job.run_dir) == run_dir, point
        assert job.config_hash == config_hash(scrub_secrets(task_config)), point
        assert job.renumbered(num + 100).config.hydra.job.num == num + 100
    assert 0 < failed < len(points)  # the sample holds both kinds
