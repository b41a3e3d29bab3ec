"""The parallel plan (dpo_sweeps/parallel/plan.py): one resolution of fsdp + precision + resources that the
mesh, the mixed-precision policy, the loss scaler, the memory estimate, the MFU peak, summary.json and the
report all read. The configs are the real conf/ composed by Hydra (tests/integration/test_parallel_plan_run.py
checks the plan a real run records)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from support import REPO, cli_env
from support.reports import write_run

from dpo_sweeps.analysis.figures import heatmap_figure
from dpo_sweeps.analysis.ranking import rank_sweep
from dpo_sweeps.analysis.runs import read_run
from dpo_sweeps.analysis.tables import run_rows
from dpo_sweeps.config.schema import Config
from dpo_sweeps.data.rows import longest_rows
from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.parallel.fit import predicted_peak_gib
from dpo_sweeps.parallel.memory_estimate import run_shape_of
from dpo_sweeps.parallel.plan import DTYPES, ParallelPlan, resolve_plan
from dpo_sweeps.parallel.precision import loss_scaler, mixed_precision_policy

STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")
PRECISIONS = ("fp32", "bf16", "fp16")
LAYOUTS = ((1, 1), (1, 2), (2, 2), (1, 4))  # (resources.nodes, resources.nproc_per_node)
TECHNIQUES = ((False, False), (True, True))  # (fsdp.cpu_offload, fsdp.activation_checkpointing)


@pytest.fixture(scope="module")
def plain():
    """Compose the real conf/ with overrides and resolve it, as `python -m dpo_sweeps OVERRIDES` would."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield lambda *overrides: OmegaConf.to_container(compose("config", overrides=list(overrides)), resolve=True)


@pytest.fixture(scope="module")
def composer(plain):
    """The same, as the typed config a rank reads (Config.of)."""
    return lambda *overrides: Config.of(plain(*overrides))


def plan_of(cfg) -> ParallelPlan:
    return resolve_plan(cfg)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_precision_layout_and_technique_resolves_to_a_consistent_plan(composer, strategy):
    for precision, (nodes, nproc), (offload, checkpointing) in itertools.product(PRECISIONS, LAYOUTS, TECHNIQUES):
        cfg = composer(f"fsdp={strategy}", f"precision={precision}", f"resources.nodes={nodes}",
                       f"resources.nproc_per_node={nproc}", f"fsdp.cpu_offload={offload}",
                       f"fsdp.activation_checkpointing={checkpointing}")
        plan, world, case = plan_of(cfg), nodes * nproc, (strategy, precision, nodes, nproc, offload)
        assert plan.world_size == world and plan.mesh == dict(zip(plan.mesh_dim_names, plan.mesh_shape)), case
        assert plan.replicate_size * plan.shard_size == world, case
        hybrid = {"replicate": nodes, "shard": nproc} if nodes > 1 else {"shard": world}  # null group: one node
        expected_mesh = {"full_shard": {"shard": world}, "shard_grad_op": {"shard": world}, "hybrid_shard": hybrid,
                         "no_shard": {"replicate": world, "shard": 1}}[strategy]
        assert plan.mesh == expected_mesh, case
        # The label says what the mesh and the reshard policy make of the preset.
        assert plan.reshard_after_forward == (strategy in ("full_shard", "hybrid_shard")), case
        if world == 1 or strategy == "no_shard" or (strategy == "hybrid_shard" and nproc == 1):
            assert plan.strategy == "NO_SHARD", case
        elif strategy == "hybrid_shard" and nodes > 1:
            assert plan.strategy == "HYBRID_SHARD", case
        else:
            assert plan.strategy == {"full_shard": "FULL_SHARD", "shard_grad_op": "SHARD_GRAD_OP",
                                     "hybrid_shard": "FULL_SHARD"}[strategy], case  # one node: one group
        assert plan.label == f"{plan.strategy} {precision}" and plan.compute == precision, case
        # Dtypes as the preset writes them, and FSDP's policy built from the plan.
        assert (plan.param_dtype, plan.reduce_dtype) == (cfg.precision.param_dtype, cfg.precision.reduce_dtype), case
        assert DTYPES[plan.param_dtype].short == precision, case
        policy = mixed_precision_policy(plan)
        assert policy.param_dtype == getattr(torch, cfg.precision.param_dtype), case
        assert policy.reduce_dtype == torch.float32 and plan.casts == (precision != "fp32"), case
        # Loss scaling for fp16 only, with the preset's own settings.
        scaler = loss_scaler(plan)
        assert scaler.enabled == plan.loss_scaling == (precision == "fp16"), case
        if precision == "fp16":
            assert (scaler.scale, scaler.growth_interval) == (cfg.precision.initial_loss_scale,
                                                              cfg.precision.loss_scale_growth_interval), case
        assert (plan.cpu_offload, plan.activation_checkpointing) == (offload, checkpointing), case
        # The memory estimate's shape comes from the same plan.
        shape = run_shape_of(cfg, plan)
        longest = longest_rows(cfg.train.micro_batch_size, cfg.data.max_length, cfg.data.max_prompt_length,
                               share_prompt=cfg.train.share_prompt)  # spelled out: the test reads the config itself
        assert (shape.seq_len, shape.response_fraction) == (longest.length, longest.response_fraction), case
        assert (shape.shard_group_size, shape.param_dtype, shape.reshard_after_forward, shape.cpu_offload,
                shape.activation_checkpointing) == (plan.shard_size, plan.param_dtype, plan.reshard_after_forward,
                                                    offload, checkpointing), case
        block = plan.as_dict()
        assert json.loads(json.dumps(block)) == block and block["label"] == plan.label, case


@pytest.mark.parametrize(("overrides", "same_as"), [
    # Trains as SHARD_GRAD_OP (parameters kept gathered): labelled and estimated as one.
    (["fsdp=full_shard", "fsdp.reshard_after_forward=false"], ["fsdp=shard_grad_op"]),
    (["fsdp=shard_grad_op", "fsdp.reshard_after_forward=true"], ["fsdp=full_shard"]),
    # One shard group over all ranks is a 1-D full shard; groups of one rank are replicas.
    (["fsdp=hybrid_shard", "fsdp.hybrid_group_size=4"], ["fsdp=full_shard"]),
    (["fsdp=hybrid_shard", "fsdp.hybrid_group_size=1", "fsdp.reshard_after_forward=false"], ["fsdp=no_shard"]),
])
def test_a_preset_changed_by_its_settings_is_labelled_and_estimated_as_what_it_runs(composer, overrides, same_as):
    # On CUDA the estimate has no process baseline: a pure function of the config.
    # Six blocks: kept gathered (all of them) and resharded (the root and two) differ.
    common = ["resources.nodes=2", "resources.nproc_per_node=2", "precision=bf16", "resources.device=cuda",
              "model.from_config.n_layer=6"]
    plan, other = plan_of(composer(*common, *overrides)), plan_of(composer(*common, *same_as))
    assert (plan.label, plan.strategy, plan.reshard_after_forward) == (other.label, other.strategy,
                                                                      other.reshard_after_forward)
    assert plan.mesh == other.mesh and plan.replicate_size * plan.shard_size == 4
    assert {k: v for k, v in plan.as_dict().items() if k != "sharding_strategy"} == \
           {k: v for k, v in other.as_dict().items() if k != "sharding_strategy"}
    # The pre-launch estimate (parallel/fit.py, the tiny GPT-2's real architecture) agrees too.
    estimate = predicted_peak_gib(composer(*common, *overrides), 4)
    assert estimate == predicted_peak_gib(composer(*common, *same_as), 4)
    gathered, resharded = (predicted_peak_gib(composer(*common, f"fsdp={s}"), 4) for s in ("shard_grad_op", "full_shard"))
    assert gathered > resharded  # so the equality above tells the two apart


def test_the_precision_label_and_mfu_key_follow_the_dtypes_not_the_preset_name(composer):
    renamed = plan_of(composer("precision=bf16", "precision.param_dtype=float32"))
    assert renamed.compute == "fp32" and renamed.label == "NO_SHARD fp32"
    bf16_reduce = plan_of(composer("precision=bf16", "precision.reduce_dtype=bfloat16"))
    assert bf16_reduce.precision == "bf16 (bf16 reduce)" and bf16_reduce.compute == "bf16"
    unscaled = plan_of(composer("precision=fp16", "precision.loss_scaling=false"))
    assert unscaled.precision == "fp16 (no loss scaling)" and unscaled.as_dict()["loss_scaling"] is None


@pytest.mark.parametrize(("overrides", "setting"), [
    (["fsdp.sharding_strategy=zero3"], "fsdp.sharding_strategy"),
    (["fsdp=hybrid_shard", "resources.nproc_per_node=3", "fsdp.hybrid_group_size=2"], "fsdp.hybrid_group_size"),
    (["precision.param_dtype=float8"], "precision.param_dtype"),
    (["precision.reduce_dtype=half"], "precision.reduce_dtype"),
])
def test_a_setting_the_plan_cannot_resolve_is_named(composer, overrides, setting):
    with pytest.raises(InvalidConfig) as error:
        plan_of(composer(*overrides))
    assert error.value.setting == setting and str(error.value).startswith(f"{setting}: ")


def test_the_report_labels_runs_by_their_plan(tmp_path, plain):
    """A run dir's summary `plan` names its heatmap row; a run without one is labelled from its config."""
    for job, overrides in enumerate([["fsdp=full_shard", "fsdp.reshard_after_forward=false"], ["fsdp=shard_grad_op"],
                                     ["fsdp=full_shard"]]):
        config = plain("resources.nproc_per_node=2", "precision=bf16", *overrides)
        run_dir = write_run(tmp_path / str(job), job, overrides, config, status="completed",
                            metrics={"perf/speed_per_memory": 1.0 + job, "eval/rewards/accuracies": 0.5})
        if job == 0:  # the trainer's plan block, as written by a rank
            summary = json.loads((run_dir / "summary.json").read_text())
            (run_dir / "summary.json").write_text(json.dumps({**summary, "plan": plan_of(Config.of(config)).as_dict()}))
    runs = [read_run(tmp_path / str(job), str(job), tmp_path) for job in range(3)]
    assert [r.strategy_label for r in runs] == ["SHARD_GRAD_OP", "SHARD_GRAD_OP", "FULL_SHARD"]
    assert {r.precision_label for r in runs} == {"bf16"}
    figure = heatmap_figure(runs)
    rows = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert rows == ["FULL_SHARD", "SHARD_GRAD_OP"]
    csv_rows = run_rows(runs, rank_sweep(runs))  # runs.csv's `plan` column
    assert [r["plan"] for r in csv_rows] == ["SHARD_GRAD_OP bf16", "SHARD_GRAD_OP bf16", "FULL_SHARD bf16"]


def test_reading_a_plan_imports_no_training_stack():
    """Launchers and the report resolve plans too: the plan module costs no torch import."""
    code = ("import sys, dpo_sweeps.parallel.plan as plan, dpo_sweeps.analysis.runs; "
            "from dpo_sweeps.config.schema import Config; "
            "plan.resolve_plan(Config.of({'fsdp': {'sharding_strategy': 'no_shard', 'reshard_after_forward': False, "
            "'hybrid_group_size': None, 'cpu_offload': False, 'activation_checkpointing': False}, "
            "'precision': {'param_dtype': 'bfloat16', 'reduce_dtype': 'float32', 'loss_scaling': False}, "
            "'resources': {'nodes': 1, 'nproc_per_node': 2}})); "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'wandb') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"
