"""Every way a run is stopped, through the real CLI: Ctrl-C (SIGINT) and a closed terminal (SIGHUP)
end a run without a traceback, with a checkpoint and summary kind `interrupted`, and the same
command resumes it exactly; a job refused on a busy run directory writes nothing there at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import QUIET, REPO, cli_env, run_cli

from dpo_sweeps.parallel.rank_env import free_port
from dpo_sweeps.rundir.lock import RunDirLock

# 2 self-spawned ranks, 12 steps, no periodic checkpoint: only the stop's checkpoint is there to resume from.
TWO_RANKS = [*QUIET, "data.num_train_pairs=256", "data.num_eval_pairs=32", "resources.nproc_per_node=2",
             "train.max_steps=12", "train.eval_every=6", "checkpoint.every_steps=0"]

# Stopped by Ctrl-C before the run started: exit 130, or killed by SIGINT, which a shell also shows as 130
# (Python ends itself with SIGINT when the interrupt landed in some imports, though main() caught it and
# said its one line: seen once in 17 tries, about 0.9 s into the job importing the training stack).
INTERRUPTED = (130, -signal.SIGINT)


def as_from_a_terminal() -> None:
    """In the child, before exec: SIGINT and SIGHUP do what they do for a command typed at a terminal. A
    suite started in the background (`nohup`, a shell's `&`) would otherwise pass them on ignored, and the
    run rightly keeps an ignored terminal signal ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def tree(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder`: its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def signal_at(args: list[str], run_dir: Path, step: int, sig: signal.Signals,
              group: bool = False) -> subprocess.CompletedProcess:
    """Start `args`, send `sig` once run_dir's metrics.jsonl has `step` (to the whole process group, as
    a terminal does, with `group`), wait for it to end."""
    proc = subprocess.Popen(args, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=group, preexec_fn=as_from_a_terminal)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 240
    try:
        while not (metrics.exists() and any(json.loads(line)["step"] >= step for line in metrics.read_text().splitlines()
                                            if line.strip())):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:] if proc.stdout else ""
            time.sleep(0.1)
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        output, _ = proc.communicate(timeout=120)
    finally:
        if group:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
    return subprocess.CompletedProcess(args, proc.returncode, output)


def stop_at(run_dir: Path, step: int, sig: signal.Signals) -> tuple[subprocess.CompletedProcess, dict]:
    """Start the run, send `sig` once metrics.jsonl has `step`, wait for it to end."""
    args = [sys.executable, "-m", "dpo_sweeps", *TWO_RANKS, f"hydra.run.dir={run_dir}"]
    ended = signal_at(args, run_dir, step, sig)
    return ended, json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_ctrl_c_then_a_closed_terminal_stop_with_checkpoints_and_the_same_command_resumes_exactly(tmp_path):
    baseline = run_cli(tmp_path / "uninterrupted", *TWO_RANKS)
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    run_dir = tmp_path / "run"

    first, stopped = stop_at(run_dir, 2, signal.SIGINT)
    assert first.returncode == 1 and "Traceback" not in first.stdout, first.stdout[-3000:]
    assert stopped["failure"]["kind"] == "interrupted" and "SIGINT (Ctrl-C) received" in stopped["failure"]["message"]
    assert first.stdout.count("error: ") == 1
    at = stopped["metrics"]["steps"]
    assert (run_dir / "checkpoints" / f"step_{at}").is_dir()

    second, hung_up = stop_at(run_dir, at + 2, signal.SIGHUP)
    assert second.returncode == 1 and "Traceback" not in second.stdout, second.stdout[-3000:]
    assert hung_up["failure"]["kind"] == "interrupted" and "SIGHUP" in hung_up["failure"]["message"]
    assert hung_up["resumed_from_step"] == at

    final = run_cli(run_dir, *TWO_RANKS)
    assert final.returncode == 0, final.stderr[-2000:]
    assert final.summary["resumed_from_step"] == hung_up["metrics"]["steps"]
    assert final.train_losses() == baseline.train_losses() and len(final.train_losses()) == 12
    assert final.summary["metrics"]["eval/loss"] == baseline.summary["metrics"]["eval/loss"]


@pytest.mark.slow
def test_ctrl_c_then_a_closed_terminal_in_a_local_sweep_stop_its_running_job_and_the_same_command_finishes_it(tmp_path):
    """A terminal's Ctrl-C, and its closing (SIGHUP), reach the whole foreground process group: the sweep
    process, the local launcher's job and its ranks. The running point stops `interrupted` at a checkpoint,
    the screen has no traceback, and the same command runs what is left, resuming that point."""
    sweep_dir, point = tmp_path / "sweep", tmp_path / "sweep" / "0"
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *TWO_RANKS, "train.seed=1,2", f"hydra.sweep.dir={sweep_dir}"]
    ctrl_c = signal_at(args, point, 2, signal.SIGINT, group=True)
    assert ctrl_c.returncode != 0 and "Traceback" not in ctrl_c.stdout, ctrl_c.stdout[-3000:]
    stopped = json.loads((point / "summary.json").read_text())
    assert stopped["failure"]["kind"] == "interrupted", stopped["failure"]
    at = stopped["metrics"]["steps"]
    assert (point / "checkpoints" / f"step_{at}").is_dir()
    assert not (sweep_dir / "1" / "summary.json").exists()  # never started

    hang_up = signal_at(args, point, at + 2, signal.SIGHUP, group=True)
    assert hang_up.returncode != 0 and "Traceback" not in hang_up.stdout, hang_up.stdout[-3000:]
    hung_up = json.loads((point / "summary.json").read_text())
    assert hung_up["failure"]["kind"] == "interrupted" and "SIGHUP" in hung_up["failure"]["message"], hung_up
    assert hung_up["resumed_from_step"] == at
    at = hung_up["metrics"]["steps"]
    assert (point / "checkpoints" / f"step_{at}").is_dir()

    again = subprocess.run(args, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    first, second = (json.loads((sweep_dir / n / "summary.json").read_text()) for n in ("0", "1"))
    assert first["status"] == second["status"] == "completed"
    assert first["resumed_from_step"] == at and first["metrics"]["steps"] == 12


@pytest.mark.parametrize("imported", ["hydra", "dpo_sweeps.config.schema", "dpo_sweeps.task"])
def test_ctrl_c_while_the_command_starts_is_one_line(tmp_path, imported):
    """In its first moments the command is importing (before main() can catch KeyboardInterrupt). The Ctrl-C
    lands at a point of the imports, not at a time: `-X importtime` reports each module as it is imported,
    and the signal goes as soon as `imported` is: Hydra, the schema, the job's module (all after the package's
    first line has taken Ctrl-C over; before it, Python itself is still starting)."""
    args = [sys.executable, "-X", "importtime", "-m", "dpo_sweeps", *QUIET, f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(args, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=as_from_a_terminal)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == imported:
            break
    else:
        pytest.fail(f"the command never imported {imported}: {''.join(seen)[-3000:]}")
    os.killpg(proc.pid, signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    stderr = [line for line in (''.join(seen) + rest).splitlines() if not line.startswith("import time:")]
    assert proc.returncode in INTERRUPTED, stderr[-30:]
    assert stderr == ["error: interrupted (Ctrl-C) before the run started; nothing was trained"]
    assert not (tmp_path / "run").exists()


def test_ctrl_c_while_the_job_imports_the_training_stack_leaves_nothing_in_the_run_dir(tmp_path):
    """Hydra has made the (empty) run directory; the job is importing torch, before the run takes it. The
    folder goes when the Ctrl-C reaches the job's function (dpo_sweeps/task.py); one that lands in Hydra's
    own code just before it leaves the folder Hydra made, empty."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dpo_sweeps", *QUIET, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(args, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=as_from_a_terminal)
    while not run_dir.exists() and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode in INTERRUPTED, stderr[-3000:]
    assert stderr.strip().splitlines() == ["error: interrupted (Ctrl-C) before the run started; nothing was trained"]
    assert not run_dir.exists() or not any(run_dir.iterdir()), sorted(run_dir.rglob("*"))


@pytest.mark.slow
def test_ctrl_c_under_dpo_sweeps_torchrun_stops_with_a_checkpoint_and_no_traceback(tmp_path):
    """dpo-sweeps-torchrun (torchrun's own code, its stop report one line): the ranks checkpoint and record
    `interrupted`; rank 0's is the one error line."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "dpo_sweeps.runtime.torchrun_launch", "--nproc_per_node=2",
            f"--master_port={free_port()}", "-m", "dpo_sweeps", *TWO_RANKS, "train.max_steps=200",
            f"hydra.run.dir={run_dir}"]
    stopped = signal_at(args, run_dir, 2, signal.SIGINT, group=True)
    assert "Traceback" not in stopped.stdout and stopped.returncode == 128 + signal.SIGINT, stopped.stdout[-3000:]
    assert stopped.stdout.count("error: ") == 1 and "torchrun: stopped by SIGINT" in stopped.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failure"]["kind"] == "interrupted" and summary["metrics"]["world_size"] == 2, summary["failure"]
    assert (run_dir / "checkpoints" / f"step_{summary['metrics']['steps']}").is_dir()


def test_a_job_refused_on_a_busy_run_dir_writes_nothing_there_hydra_record_included(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run_dir / ".hydra" / name).write_text(f"# the live job's {name}\n")
    (run_dir / "task.log").write_text("the live job's log\n")
    lock = RunDirLock(run_dir).acquire()  # this test process is the live job
    before = tree(run_dir)
    try:
        refused = run_cli(run_dir, "train.max_steps=2", "train.lr=0.01")
    finally:
        lock.release()
    assert refused.returncode == 1 and f"is being written by pid {os.getpid()}" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stderr.count("error: ") == 1
    after = tree(run_dir)
    after[".lock"] = before[".lock"]  # the live job's own lock file, emptied by its release
    assert after == before


def test_the_owner_writes_the_hydra_record_with_secrets_redacted(tmp_path):
    result = run_cli(tmp_path / "run", "train.max_steps=1", "train.eval_every=0", "+model.hf_token=hf_secret_123456",
                     "data.num_train_pairs=64", "data.num_eval_pairs=8")
    assert result.returncode == 0, result.stderr[-2000:]
    record = tmp_path / "run" / ".hydra"
    assert sorted(p.name for p in record.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert all("hf_secret_123456" not in p.read_text() for p in record.iterdir())
    assert "train.max_steps=1" in (record / "overrides.yaml").read_text()


@pytest.mark.slow
def test_a_stop_during_the_reference_pass_ends_the_run_there_and_the_same_command_starts_it_again(tmp_path,
                                                                                                monkeypatch):
    """The reference log-prob pass before training (minutes on a real model) honours a stop between its
    micro-batches on every rank: here train.time_limit_min is already reached when it begins."""
    monkeypatch.setenv("DPO_SWEEPS_CACHE", str(tmp_path / "cache"))  # no cached log-probs: the pass runs
    run_dir = tmp_path / "run"
    stopped = run_cli(run_dir, *TWO_RANKS, "train.time_limit_min=0.0001")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert stopped.returncode != 0 and summary["failure"]["kind"] == "timeout", stopped.stderr[-3000:]
    assert "stopped while scoring the reference log-probs" in summary["failure"]["message"], summary["failure"]
    assert "Traceback" not in stopped.stderr and not (run_dir / "checkpoints").exists()
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip()
    again = run_cli(run_dir, *TWO_RANKS)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["metrics"]["steps"] == 12
