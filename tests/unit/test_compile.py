"""train.compile (parallel/compile.py): each transformer block's forward compiled, one graph for every block
and every length; refused in one line where torch.compile cannot build its kernels; the first step's
compile reported apart from the step time (train/perf.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from support import REPO, cli_env

from dpo_sweeps.train.perf import PerfMeter, graphs_compiled

# A machine without a C++ compiler: PATH with nothing on it, CXX unset (inductor then tries only g++).
NO_COMPILER = {"PATH": "", "CXX": None}


def env_with(changes: dict[str, str | None]) -> dict[str, str]:
    env = cli_env()
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def test_a_sweep_asking_to_compile_without_a_cpp_compiler_is_refused_in_one_line(tmp_path):
    """The pre-launch check (launchers/preflight.py) refuses it before any job starts, naming what to install."""
    args = [sys.executable, "-m", "dpo_sweeps", "-m", "wandb.mode=disabled", "train.compile=true",
            "train.max_steps=1", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.run(args, cwd=REPO, env=env_with(NO_COMPILER), capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "no job was started" in proc.stderr
    refusal = ("invalid_config: train.compile: true with resources.device=auto: inductor finds no C++ compiler "
               "(tried g++); install g++ (apt install g++) or set CXX to a C++ compiler (accepted: false, or true "
               "where torch.compile can build its kernels)")
    assert refusal in [line.strip() for line in proc.stderr.splitlines()]  # the point's whole line
    assert not list((tmp_path / "sweep").glob("*/summary.json"))


def test_this_machine_can_compile():
    from dpo_sweeps.parallel.compile import compile_problem

    assert compile_problem("cpu") is None  # g++ is here: the tests that compile need it


def tiny_llama():
    from omegaconf import OmegaConf

    from dpo_sweeps import api
    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.models.build import build_policy, build_tokenizer

    composed = OmegaConf.to_container(api.compose(["model=tiny_llama"]))
    composed.pop("hydra")
    cfg = Config.of(OmegaConf.to_container(OmegaConf.create(composed), resolve=True))
    return cfg, build_policy(cfg.model, build_tokenizer(cfg.model, ["a b c"]), seed=0)


def test_each_block_is_compiled_in_place_and_scores_as_the_eager_model():
    """Prefix-shared rows (train.share_prompt's 4-D boolean mask) of two lengths, scored without grad as the
    evaluation scores them: the eager model's log-probs up to inductor's float reordering, from one graph
    that both blocks and both lengths reuse (dynamic sizes); the blocks keep their parameter names. (With
    grad and activation checkpointing: tests/integration/test_packing_fsdp.py.)"""
    import copy

    from dpo_sweeps.data.collate import collate
    from dpo_sweeps.data.encoding import EncodedPair
    from dpo_sweeps.dpo.response_logps import response_logps
    from dpo_sweeps.models.build import check_block_name
    from dpo_sweeps.parallel.compile import compile_blocks, is_compiled

    cfg, model = tiny_llama()
    eager = copy.deepcopy(model)
    names = list(model.state_dict())
    blocks = check_block_name(model, cfg.model.block_name)
    compile_blocks(blocks, torch.device("cpu"))
    assert len(blocks) == 2 and all(is_compiled(b) for b in blocks)
    assert not any(is_compiled(m) for m in model.modules() if m not in blocks)
    assert list(model.state_dict()) == names  # no `_orig_mod.` in a checkpoint's or saved model's names
    before = graphs_compiled()
    with torch.no_grad():
        for prompt, chosen, rejected in ((5, 3, 4), (9, 6, 2)):
            pairs = [EncodedPair(list(range(10, 10 + prompt)), list(range(40, 40 + chosen)),
                                 list(range(70, 70 + rejected))) for _ in range(2)]
            batch = collate(pairs, 0, share_prompt=True)
            assert batch["attention_mask"].dim() == 4
            compiled, expected = (response_logps(m, batch, 16).sums for m in (model, eager))
            torch.testing.assert_close(compiled, expected, rtol=1e-5, atol=1e-5)
    # One graph, not one per block or length; and one at all: a block dynamo could not trace would run
    # eagerly without a word.
    assert graphs_compiled() - before == 1


def test_a_compiled_first_step_is_reported_apart_from_the_timed_steps():
    """perf/compile_s is the first step beyond the median timed step; the first step stays out of the timed
    steps even with perf.warmup_steps=0. A run whose first step compiled nothing reports no compile."""
    square = torch.compile(lambda x: x * x, backend="eager")  # the counting is dynamo's, whatever the backend
    meter = PerfMeter(torch.device("cpu"), warmup_steps=0)
    for step in range(4):
        meter.start()
        square(torch.ones(3)) if step == 0 else None
        meter.stop(tokens=10, pairs=1)
    assert meter.first_step_compiled
    perf = meter.summary(world_size=1, peak_flops=None, mfu_reason="cpu")
    assert perf["perf/timed_steps"] == 3
    assert perf["perf/first_step_s"] == meter.step_times[0]
    assert perf["perf/step_time_s"] == pytest.approx(sorted(meter.step_times[1:])[1])
    assert perf["perf/compile_s"] == pytest.approx(meter.step_times[0] - perf["perf/step_time_s"])

    again = PerfMeter(torch.device("cpu"), warmup_steps=0)
    for _ in range(2):
        again.start()
        square(torch.ones(3))  # compiled already
        again.stop(tokens=10, pairs=1)
    perf = again.summary(world_size=1, peak_flops=None, mfu_reason="cpu")
    assert not again.first_step_compiled and perf["perf/compile_s"] is None
    assert perf["perf/timed_steps"] == 2 and perf["perf/first_step_s"] == again.step_times[0]

