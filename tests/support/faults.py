"""Shared by the tests/*/test_faults*.py modules: start a real run or sweep, watch its ranks through
their heartbeats (pids, steps), do something to a rank, and time fault -> failed summary."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dpo_sweeps.runtime.watchdog import read_heartbeats
from support import QUIET, REPO, cli_env

# A few steps on small synthetic data, a checkpoint every 2 steps (a test that injects a fault names its step).
SHORT = [*QUIET, "data.num_train_pairs=256", "data.num_eval_pairs=32", "train.max_steps=5", "train.eval_every=0",
         "checkpoint.every_steps=2"]
# A hang is declared after 10 s without progress; collectives would give up only after 120 s.
HANG_BOUND = ["resources.hang_timeout_s=10", "resources.collective_timeout_s=120"]
_LOGGED = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[[^\]]+\]\[WARNING\]\s*-?\s*injected (\w+)")
FAULT_TIMES = os.environ.get("DPO_SWEEPS_FAULT_TIMES")  # a file to append {fault, seconds, test} records to


@dataclass
class Watched:
    returncode: int
    output: str
    elapsed: float
    pids: set[int] = field(default_factory=set)  # every rank process seen in a heartbeat
    acted_at: float | None = None  # when `act` did its thing (time.time())
    # Every process run_watched starts, and each of their descendants, carries this in its environment:
    # what is left is found even where a rank ended its run before the 0.2 s poll read its heartbeat.
    marker: str = field(default_factory=lambda: f"{WATCH_VAR}={uuid.uuid4().hex}")
    marked: set[int] = field(default_factory=set)  # every marked process seen while the command ran

    def alive(self) -> list[int]:
        """The rank processes and the command's descendants still running (zombies count as gone)."""
        return sorted(pid for pid in self.pids | set(marked_processes(self.marker)) if _running(pid))


WATCH_VAR = "DPO_SWEEPS_TEST_WATCH"


def marked_processes(marker: str) -> list[int]:
    """The processes whose environment holds `marker` (NAME=VALUE)."""
    needle = marker.encode() + b"\0"
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "environ").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_watched(args: list[str], run_dirs: Callable[[], list[Path]], *, act: Callable[[dict], bool] | None = None,
                timeout: float = 400) -> Watched:
    """Run `args` from the repository root; every 0.2 s read the heartbeats of `run_dirs()`, and call
    `act(heartbeats)` until it returns True (it did its thing)."""
    started = time.monotonic()
    out = Watched(0, "", 0.0)
    name, _, value = out.marker.partition("=")
    proc = subprocess.Popen(args, cwd=REPO, env={**cli_env(), name: value}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            if time.monotonic() - started > timeout:
                raise AssertionError(f"still running after {timeout} s:\n{''.join(chunks)[-3000:]}")
            for run_dir in run_dirs():
                beats = read_heartbeats(run_dir)
                out.pids |= {b["pid"] for b in beats.values()}
                if act is not None and out.acted_at is None and beats and act(beats):
                    out.acted_at = time.time()
            out.marked |= set(marked_processes(out.marker)) - {proc.pid}
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=5)
    out.returncode, out.output, out.elapsed = proc.returncode, "".join(chunks), time.monotonic() - started
    return out


def dpo(*overrides: str, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "dpo_sweeps", *SHORT, *overrides, f"hydra.run.dir={run_dir}"]


def injected_at(output: str, kind: str) -> float:
    """When the run logged `injected <kind>` (its log's local time, as time.time())."""
    for stamp, logged in _LOGGED.findall(output):
        if logged == kind:
            return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise AssertionError(f"no 'injected {kind}' in the output:\n{output[-3000:]}")


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def fault_to_summary(run_dir: Path, fault_at: float, fault: str, test: str) -> float:
    """Seconds from the fault to the failed summary.json, recorded for the issue's note."""
    return record_seconds(fault, (run_dir / "summary.json").stat().st_mtime - fault_at, test)


def record_seconds(what: str, seconds: float, test: str) -> float:
    """Print a measured duration (and append it to $DPO_SWEEPS_FAULT_TIMES when set); no test asserts on it."""
    print(f"seconds {what}: {seconds:.1f} ({test})")
    if FAULT_TIMES:
        with open(FAULT_TIMES, "a") as f:
            f.write(json.dumps({"what": what, "seconds": round(seconds, 1), "test": test}) + "\n")
    return seconds
