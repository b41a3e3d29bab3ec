"""`resources.cpu_allocator`: the ranks dpo-sweeps starts run with the malloc the config names (auto, the
default: tcmalloc for several CPU ranks where it is installed), a rank started by someone else without the one named is
refused before it trains, and a library this machine lacks is refused before anything runs
(dpo_sweeps/parallel/allocator.py). Real runs: tiny models, real processes.

tcmalloc comes from tests/install_system_deps.sh (Debian's libtcmalloc-minimal4); without it the tests that
need it skip, except under CI, where they fail (support.require_tcmalloc).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support import QUIET, REPO, cli_env, require_tcmalloc, run_cli, summary_json

from dpo_sweeps.parallel import allocator
from dpo_sweeps.parallel.rank_env import free_port

SHORT = ["model=tiny_llama", "data.num_train_pairs=64", "data.num_eval_pairs=16", "train.max_steps=2",
         "train.eval_every=0", "perf.warmup_steps=1"]


@pytest.fixture(scope="module")
def tcmalloc() -> str:
    return require_tcmalloc()


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_ranks_dpo_sweeps_starts_run_with_tcmalloc(tmp_path, tcmalloc, ranks):
    run = run_cli(tmp_path / "run", *SHORT, f"resources.nproc_per_node={ranks}", "resources.cpu_allocator=tcmalloc")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = run.summary
    assert summary["layout"]["cpu_allocator"] == "tcmalloc"
    # The estimate counts tcmalloc's held memory, not glibc's heap: the same config's pre-launch estimate.
    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.parallel.fit import predicted_peak_gib

    config = Config.of(summary["config"])
    glibc = Config.of({**summary["config"], "resources": {**summary["config"]["resources"], "cpu_allocator": "glibc"}})
    assert predicted_peak_gib(config, ranks) <= predicted_peak_gib(glibc, ranks)


def test_the_default_is_tcmalloc_for_several_ranks_where_installed_and_glibc_when_named(tmp_path, tcmalloc):
    chosen = run_cli(tmp_path / "auto", *SHORT, "resources.nproc_per_node=2")
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    assert chosen.summary["config"]["resources"]["cpu_allocator"] == "auto"
    assert chosen.summary["layout"]["cpu_allocator"] == "tcmalloc"
    named = run_cli(tmp_path / "glibc", *SHORT, "resources.nproc_per_node=2", "resources.cpu_allocator=glibc")
    assert named.returncode == 0, named.stderr[-3000:]
    assert named.summary["layout"]["cpu_allocator"] == "glibc"
    # One rank trains in the process it was started in (the CLI's, without LD_PRELOAD): glibc.
    one = run_cli(tmp_path / "one", *SHORT)
    assert one.returncode == 0, one.stderr[-3000:]
    assert one.summary["layout"]["cpu_allocator"] == "glibc"


def test_auto_picks_glibc_for_one_rank_on_a_gpu_or_without_the_library_and_takes_a_ranks_malloc(monkeypatch):
    assert allocator.chosen_allocator("auto", on_gpu=True, world_size=2) == "glibc"
    assert allocator.chosen_allocator("auto", on_gpu=False, world_size=1) == "glibc"
    assert allocator.chosen_allocator("glibc", on_gpu=False, world_size=2) == "glibc"
    assert allocator.chosen_allocator("tcmalloc", on_gpu=True, world_size=1) == "tcmalloc"  # named outright
    if allocator.allocator_library("tcmalloc"):
        assert allocator.chosen_allocator("auto", on_gpu=False, world_size=2) == "tcmalloc"
    monkeypatch.setitem(allocator.LIBRARIES, "tcmalloc", ("dpo_sweeps_no_such_malloc",))
    assert allocator.chosen_allocator("auto", on_gpu=False, world_size=2) == "glibc"
    assert allocator.missing_allocator("auto") is None
    allocator.check_allocator_in_use("auto")  # a rank torchrun started, with whichever malloc: not refused


def test_a_local_sweeps_jobs_run_with_the_malloc_each_run_asks_for(tmp_path, tcmalloc):
    """hydra/launcher=local (the default of -m) starts each job's ranks as submitit tasks, not dpo-sweeps."""
    from support.sweeps import run_sweep

    result = run_sweep(tmp_path / "sweep", *SHORT, "resources.cpu_allocator=auto,glibc,tcmalloc",
                       "resources.nproc_per_node=1,2")
    assert result.returncode == 0, result.output[-3000:]
    layouts = {tuple(result.summary(n)["config"]["resources"][k] for k in ("cpu_allocator", "nproc_per_node")):
               result.summary(n)["layout"]["cpu_allocator"] for n in range(6)}
    assert layouts == {("auto", 1): "glibc", ("glibc", 1): "glibc", ("tcmalloc", 1): "tcmalloc",
                       ("auto", 2): "tcmalloc", ("glibc", 2): "glibc", ("tcmalloc", 2): "tcmalloc"}


def _torchrun_with_tcmalloc_asked(run_dir, env: dict[str, str]) -> subprocess.CompletedProcess:
    """One rank under torchrun, its config asking for tcmalloc, its environment as given."""
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    return subprocess.run([exe, "--nproc_per_node=1", f"--master_port={free_port()}", "-m", "dpo_sweeps", *QUIET,
                           *SHORT, "resources.cpu_allocator=tcmalloc", f"hydra.run.dir={run_dir}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_a_rank_torchrun_started_without_tcmalloc_is_refused_before_it_trains(tmp_path, tcmalloc):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in cli_env().items() if k != "LD_PRELOAD"}
    proc = _torchrun_with_tcmalloc_asked(run_dir, env)
    assert proc.returncode != 0
    failure = (summary_json(run_dir) or {}).get("failure")
    assert failure is not None and failure["kind"] == "invalid_config", proc.stderr[-3000:]
    assert failure["message"].startswith("resources.cpu_allocator: tcmalloc, but this rank runs with glibc's malloc")
    assert f"LD_PRELOAD={tcmalloc}" in failure["message"]
    assert not (run_dir / "metrics.jsonl").exists() or "train/loss" not in (run_dir / "metrics.jsonl").read_text()

    # Started with it in its environment, the same rank trains.
    env["LD_PRELOAD"] = tcmalloc
    proc = _torchrun_with_tcmalloc_asked(tmp_path / "preloaded", env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary_json(tmp_path / "preloaded")["layout"]["cpu_allocator"] == "tcmalloc"


def test_an_allocator_this_machine_lacks_or_does_not_know_is_refused_in_one_line(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dpo_sweeps.checks.validate import validate_config
    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.errors import InvalidConfig

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = Config.of(OmegaConf.to_container(compose("config", ["resources.cpu_allocator=tcmalloc"]), resolve=True))
    # A machine without it: the names looked up are ones no system has.
    monkeypatch.setitem(allocator.LIBRARIES, "tcmalloc", ("dpo_sweeps_no_such_malloc",))
    with pytest.raises(InvalidConfig) as refused:
        validate_config(cfg, REPO)
    assert str(refused.value) == ("resources.cpu_allocator: tcmalloc: no libdpo_sweeps_no_such_malloc on this "
                                  "machine; install gperftools' tcmalloc (Debian/Ubuntu: apt install "
                                  "libtcmalloc-minimal4; conda: gperftools) (accepted: auto (the default: tcmalloc "
                                  "where it is installed) or glibc)")

    run = run_cli(tmp_path / "run", *SHORT, "resources.cpu_allocator=jemalloc")
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].startswith(
        "error: run failed (invalid_config): resources.cpu_allocator: got 'jemalloc' (accepted: auto, glibc, "
        "tcmalloc)")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()



def test_the_process_that_starts_ranks_gives_its_environment_back(tcmalloc, monkeypatch):
    """Only the processes started inside preload tcmalloc; what LD_PRELOAD held before stays after it."""
    monkeypatch.setenv("LD_PRELOAD", "libsomething_else.so")
    with allocator.starting_processes_with("tcmalloc"):
        assert os.environ["LD_PRELOAD"] == f"{tcmalloc}:libsomething_else.so"
        child = subprocess.run([sys.executable, "-c", "from dpo_sweeps.parallel.allocator import allocator_in_use; "
                                "print(allocator_in_use())"], capture_output=True, text=True, env=cli_env())
    assert child.stdout.strip() == "tcmalloc", child.stderr
    assert os.environ["LD_PRELOAD"] == "libsomething_else.so"
    monkeypatch.delenv("LD_PRELOAD")
    with allocator.starting_processes_with("glibc"):
        assert "LD_PRELOAD" not in os.environ
    assert "LD_PRELOAD" not in os.environ
