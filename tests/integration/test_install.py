"""dpo-sweeps as users install it: Hydra finds its plugins from any directory, with an editable or a
regular install (which installs only `dpo_sweeps` and the plugins), the commands its screens print
work there, and importing the plugins costs other Hydra apps nothing."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, cli_env
from support.sweeps import FAST

from dpo_sweeps.parallel.gpu_driver import gpu_driver_present

HEAVY = ("torch", "transformers", "datasets", "wandb")
# One job of two steps: enough to show the sweeper, the launcher and the training job all load.
ONE_JOB = [*FAST, "train.max_steps=2", "perf.warmup_steps=0", "data.num_train_pairs=64",
           "data.num_eval_pairs=8", "train.batch_size=8"]


def _python(args: list[str], cwd: Path, pythonpath: Path | None = None, timeout: float = 300):
    env = cli_env()
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def test_importing_the_plugin_package_loads_no_training_stack(tmp_path):
    code = ("import sys, hydra_plugins.dpo_sweeps_launchers as p; "
            f"print(p.__file__); print([m for m in {HEAVY!r} if m in sys.modules])")
    proc = _python(["-c", code], cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout


def _command_then_heavy_modules(*args: str):
    """`python -m dpo_sweeps ARGS` run in one interpreter, which then prints which of HEAVY it loaded (the
    last line of its stdout); rank or job processes it starts are not counted."""
    code = (f"import sys, runpy; sys.argv = ['dpo_sweeps', *{list(args)!r}]\n"
            "try:\n    runpy.run_module('dpo_sweeps', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    return _python(["-c", code], cwd=REPO)


def test_help_loads_no_training_stack():
    proc = _command_then_heavy_modules("--help")
    assert proc.returncode == 0, proc.stderr
    assert "== Config ==" in proc.stdout or "Powered by Hydra" in proc.stdout, proc.stdout
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout


def test_checking_a_sweep_before_launch_loads_no_training_stack(tmp_path):
    # The sweep's own process composes and validates every point (losses, lengths, the fit check's
    # "is there a GPU") before any job starts; on a CPU machine it needs none of the training stack.
    proc = _command_then_heavy_modules("-m", "+sweep=quickstart", "hydra.sweeper.dry_run=true",
                                       f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert proc.returncode == 0, proc.stderr
    assert "dry run: 8 of 8 jobs would be launched" in proc.stdout, proc.stdout
    if not gpu_driver_present():  # with a GPU driver, torch is asked how many GPUs there are
        assert proc.stdout.splitlines()[-1] == "[]", proc.stdout


def test_a_run_on_local_ranks_imports_the_training_stack_only_in_the_ranks(tmp_path):
    # The command's own process checks the config, takes the run directory and supervises its two rank
    # processes; they train, it never needs torch (on a CPU machine, where no GPU driver is asked).
    run_dir = tmp_path / "run"
    proc = _command_then_heavy_modules(*ONE_JOB, "resources.nproc_per_node=2", "train.micro_batch_size=4",
                                       f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["metrics"]["world_size"] == 2, summary
    if not gpu_driver_present():
        assert proc.stdout.splitlines()[-1] == "[]", proc.stdout[-3000:]


def _sweep_and_report_from(cwd: Path, scripts: Path, pythonpath: Path | None = None) -> None:
    """A one-job sweep, started in `cwd` outside the repository, and the report command its end-of-sweep
    screen prints, run as printed (`scripts`: where the install put its console scripts)."""
    sweep_dir = cwd / "sweep"
    proc = _python(["-m", "dpo_sweeps", "-m", *ONE_JOB, f"hydra.sweep.dir={sweep_dir}"], cwd, pythonpath)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (sweep_dir / "0" / "summary.json").exists()
    printed = next(line for line in proc.stdout.splitlines() if line.startswith("report "))
    command = shlex.split(printed.removeprefix("report "))
    assert command[0] == "dpo-sweeps-report", printed
    env = cli_env()
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    report = subprocess.run([str(scripts / command[0]), *command[1:]], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    assert (sweep_dir / "report" / "report.html").exists()


@pytest.mark.slow
def test_editable_install_sweeps_and_reports_from_outside_the_repository(tmp_path):
    where = _python(["-c", "import dpo_sweeps; print(dpo_sweeps.__file__)"], cwd=tmp_path)
    installed = Path(where.stdout.strip() or "/nonexistent").resolve()
    if where.returncode != 0 or REPO not in installed.parents:
        message = f"this checkout is not the installed dpo-sweeps (pip install -e {REPO}); found {installed}"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    _sweep_and_report_from(tmp_path, Path(sys.executable).parent)


@pytest.mark.slow
def test_regular_install_sweeps_and_reports_from_outside_the_repository(tmp_path):
    # pip builds in the source tree (build/, *.egg-info): build from a copy, not from the checkout.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "multirun", "outputs", "wandb", ".cache", ".pytest_cache"))
    site = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(source)],
                           cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    assert (site / "dpo_sweeps" / "conf" / "config.yaml").is_file()  # conf/ travels inside the package
    # launchers/ and analysis/ travel inside it too: nothing under a generic top-level name, no cluster scripts.
    assert {p.name for p in site.iterdir() if not p.name.endswith(".dist-info")} == {"dpo_sweeps", "hydra_plugins", "bin"}
    assert (site / "dpo_sweeps" / "launchers" / "local.py").is_file()
    assert (site / "dpo_sweeps" / "analysis" / "report.py").is_file()
    assert not list(site.rglob("*.sh"))
    # PYTHONPATH comes before site-packages: this copy, not the test environment's, is the one imported.
    where = _python(["-c", "import dpo_sweeps, hydra_plugins.dpo_sweeps_launchers as p; print(dpo_sweeps.__file__, p.__file__)"],
                    tmp_path, site)
    assert where.returncode == 0 and where.stdout.count(str(site)) == 2, where.stdout + where.stderr
    # Hydra imports every installed plugin when any Hydra app starts: ours must cost it nothing.
    app = tmp_path / "other_app.py"
    app.write_text("import sys, hydra\n"
                   "@hydra.main(version_base='1.3', config_path=None)\n"
                   f"def main(cfg):\n    print([m for m in {HEAVY!r} if m in sys.modules])\n"
                   "main()\n")
    other = _python([str(app), "hydra.run.dir=other"], tmp_path, site)
    assert other.returncode == 0, other.stderr[-3000:]
    assert other.stdout.splitlines()[-1] == "[]", other.stdout
    work = tmp_path / "work"
    work.mkdir()
    _sweep_and_report_from(work, site / "bin", site)
