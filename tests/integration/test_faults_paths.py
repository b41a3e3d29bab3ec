"""Paths a run writes, through the real CLI: a problem with the run directory is one line naming the
path and the setting that moves it; a cache that cannot be written is skipped with a warning."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
from support import QUIET, REPO, cli_env, run_cli
from support.mounts import tmpfs

TINY = ["train.max_steps=1", "train.eval_every=0", "data.num_train_pairs=64", "data.num_eval_pairs=8"]


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("where", ["file", "below_a_file"])
def test_a_file_where_the_run_directory_must_be_is_one_line_naming_hydra_run_dir(tmp_path, where):
    blocker = tmp_path / "taken"
    blocker.write_text("a user's file\n")
    run_dir = blocker if where == "file" else blocker / "run"
    result = run_cli(run_dir, *TINY)
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert line.startswith(f"error: hydra.run.dir: cannot write '{run_dir}': ") and "hydra.run.dir moves it" in line
    assert blocker.read_text() == "a user's file\n"


def test_a_sweep_directory_that_is_a_file_is_one_line_naming_hydra_sweep_dir(tmp_path):
    blocker = tmp_path / "taken"
    blocker.write_text("")
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *QUIET, *TINY, "train.lr=0.01,0.02", f"hydra.sweep.dir={blocker}"]
    result = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert one_error_line(result.stderr).startswith(f"error: hydra.sweep.dir: cannot write '{blocker}'")


@pytest.fixture
def read_only_run_dir(tmp_path):
    """An existing run directory on a read-only mount (root only: a tmpfs remounted read-only)."""
    with tmpfs(tmp_path / "ro") as mount:
        (mount / "run").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        yield mount / "run"


def test_a_read_only_run_directory_is_one_line_naming_the_path_and_setting(read_only_run_dir):
    result = run_cli(read_only_run_dir, *TINY)
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    assert f"cannot write '{read_only_run_dir}" in line and "a read-only file system" in line
    assert "hydra.run.dir moves it" in line


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (root only), and `fill(free)`: a file that leaves `free` bytes of it free."""
    def fill(free: int) -> None:
        with open(mount / "filler", "wb") as f:
            f.write(b"\0" * (shutil.disk_usage(mount).free - free))
        assert shutil.disk_usage(mount).free == free

    with tmpfs(tmp_path / "small") as mount:
        yield mount, fill


def tree(root):
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def an_earlier_attempt(run_dir):
    """What an earlier attempt of another command left: its record, metrics, summary and released lock."""
    (run_dir / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run_dir / ".hydra" / name).write_text(f"# the earlier attempt's {name}\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.69}\n{"step": 2, "train/loss": 0.68}\n')
    (run_dir / "summary.json").write_text('{"status": "failed", "failure": {"kind": "crash"}}\n')
    (run_dir / ".lock").write_text("")


@pytest.mark.parametrize("free_kib, earlier", [(0, False), (12, True)], ids=["0_kib_free", "12_kib_free_earlier_attempt"])
def test_a_full_disk_before_training_is_one_line_and_changes_nothing_there(small_tmpfs, free_kib, earlier):
    # 0 KiB: the lock's record cannot be written; 12 KiB: the lock can, the .hydra/ record cannot.
    mount, fill = small_tmpfs
    run_dir = mount / "run"
    if earlier:
        an_earlier_attempt(run_dir)
    before = tree(run_dir) if earlier else None
    fill(free_kib * 1024)
    result = run_cli(run_dir, *TINY)
    assert result.returncode == 1
    assert "Logging error" not in result.stderr
    line = one_error_line(result.stderr)
    assert line.startswith(f"error: hydra.run.dir: cannot write '{run_dir}/"), line
    assert "no space left on the device" in line and "hydra.run.dir moves it" in line
    if earlier:
        assert tree(run_dir) == before  # the earlier record whole, no .tmp, the lock file as it was
    else:
        assert not run_dir.exists()  # no stray .lock, nor the folder Hydra made for the run


def test_a_disk_that_fills_during_the_run_is_one_line_naming_the_file_and_the_summary_is_written(small_tmpfs):
    # 64 KiB: the space held for summary.json takes it all, so the log file and metrics.jsonl are refused.
    mount, fill = small_tmpfs
    run_dir = mount / "run"
    fill(64 * 1024)
    result = run_cli(run_dir, *TINY)
    assert result.returncode == 1
    assert "Logging error" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: the run's log file")]
    assert len(warnings) == 1 and f"cannot write '{run_dir / 'task.log'}'" in warnings[0]
    line = one_error_line(result.stderr)
    assert line.startswith(f"error: run failed (disk_full): cannot write '{run_dir / 'metrics.jsonl'}': "), line
    assert "hydra.run.dir moves it" in line
    assert result.summary["failure"]["kind"] == "disk_full"
    assert (run_dir / "metrics.jsonl").read_text() == ""  # no half line
    assert not (run_dir / ".summary_reserve").exists()


# Root without the capability to override file permissions: a folder's mode bits hold for it too.
NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-dac_override,-dac_read_search"]


def needs_no_dac():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (to drop the capability that overrides file permissions)")


@pytest.mark.parametrize("where", ["run_dir", pytest.param("checkpoints", marks=pytest.mark.slow), "model"])
def test_no_permission_to_write_is_one_line_naming_the_path_and_setting(tmp_path, where):
    needs_no_dac()
    run_dir = tmp_path / "run"
    locked = {"run_dir": run_dir, "checkpoints": run_dir / "checkpoints", "model": run_dir / "model"}[where]
    locked.mkdir(parents=True)
    if where == "model":  # its files can be written, a new one cannot: safetensors fails in its own type
        for name in ("config.json", "generation_config.json"):
            (locked / name).write_text("{}\n")
            (locked / name).chmod(0o666)
    locked.chmod(0o555)
    args = [*NO_DAC, sys.executable, "-m", "dpo_sweeps", *QUIET, *TINY, "checkpoint.every_steps=1",
            f"train.save_model={where == 'model'}", f"hydra.run.dir={run_dir}"]
    result = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    line = one_error_line(result.stderr)
    written = {"run_dir": run_dir / ".lock", "checkpoints": locked / "step_1.tmp", "model": locked}[where]
    assert f"cannot write '{written}': permission denied" in line and "hydra.run.dir moves it" in line, line
    if where != "run_dir":  # during the run: recorded, the step's metrics kept
        assert line.startswith("error: run failed (crash): ")
        assert [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())] == [1, 1]
        assert json.loads((run_dir / "summary.json").read_text())["failure"]["message"].startswith(
            f"cannot write '{written}': permission denied (a path this user can create and write; hydra.run.dir")


@pytest.mark.parametrize("how", ["no_permission", "read_only"])
def test_each_library_s_failed_write_comes_out_as_an_os_error_naming_the_path(tmp_path, how, request):
    """torch.save, DCP, safetensors, tokenizers and Optuna's storages report a folder they cannot write in
    their own types; inside `writing(path)` (dpo_sweeps/rundir/paths.py) each is an OSError naming the path."""
    if how == "no_permission":
        needs_no_dac()
        folder, prefix, code = tmp_path / "locked", NO_DAC, errno.EACCES
        folder.mkdir()
        folder.chmod(0o555)
    else:
        folder, prefix, code = request.getfixturevalue("read_only_run_dir"), [], errno.EROFS
    args = [*prefix, sys.executable, str(REPO / "tests" / "support" / "library_writes.py"), str(folder)]
    proc = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcomes = json.loads(proc.stdout.splitlines()[-1])
    assert set(outcomes) == {"torch.save", "dcp.save", "safetensors", "tokenizers", "optuna sqlite", "optuna journal"}
    files = {"torch.save": "state.pt", "dcp.save": "checkpoint", "safetensors": "model.safetensors",
             "tokenizers": "tokenizer.json", "optuna sqlite": "optuna.db", "optuna journal": "optuna.journal"}
    assert outcomes == {name: {"errno": code, "file": str(folder / f)} for name, f in files.items()}


def test_an_optuna_study_whose_storage_cannot_be_written_is_one_line_naming_it(read_only_run_dir, tmp_path):
    from support.sweeps import run_sweep

    study = ["hydra/sweeper=optuna", "loss.beta=interval(0.05, 0.5)", "hydra.sweeper.n_trials=1"]
    in_sweep_dir = run_sweep(read_only_run_dir, *study, timeout=120)
    assert in_sweep_dir.returncode == 1
    assert one_error_line(in_sweep_dir.stderr) == (
        f"error: hydra.sweep.dir: cannot write '{read_only_run_dir / 'optuna.db'}': a read-only file system "
        "(accepted: a path this user can create and write; hydra.sweep.dir moves it)")
    journal = read_only_run_dir / "study.journal"
    elsewhere = run_sweep(tmp_path / "sweep", *study, f"hydra.sweeper.storage=journal:{journal}", timeout=120)
    assert elsewhere.returncode == 1
    assert one_error_line(elsewhere.stderr) == (
        f"error: hydra.sweeper.storage: cannot write '{journal}': a read-only file system "
        "(accepted: a path this user can create and write; hydra.sweeper.storage moves it)")
    assert not list((tmp_path / "sweep").glob("*"))  # no trial started


def test_caches_that_cannot_be_written_are_skipped_with_a_warning(tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache folder must be\n")
    env = {**cli_env(), "DPO_SWEEPS_CACHE": str(cache)}
    args = [sys.executable, "-m", "dpo_sweeps", *QUIET, *TINY, "model.tokenizer.kind=bpe",
            "model.tokenizer.vocab_size=300", "train.precompute_reference_logps=true", f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "cannot cache the tokenizer" in output and "could not cache reference log-probs" in output
