"""Up to K trials at once, a new one as soon as any ends (asynchronous trials for the Optuna sweeper).

hydra-optuna-sweeper asks for `n_jobs` trials, launches them together and waits for the slowest
before it asks again (Hydra #3091), so a slot that finished early sits idle. Here each slot is a
thread that runs one job through the launcher's own `launch_jobs` (which places it, waits for it
and writes its failed summary.json if the job dies), and the sweeper asks for the next trial the
moment any slot is free. The launchers are safe to call from several threads at once: the local
launcher hands out its cores and GPUs from one pool (launchers/local.py), SLURM schedules by itself.

`timeline` keeps when each job ran, so a benchmark can add up the time slots sat idle.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from hydra.core.utils import JobReturn

from dpo_sweeps.launchers.base import JobNotRun, failed_return
from dpo_sweeps.launchers.jobs import SweepJob, launch_numbered

# How often the waiting sweeper wakes up, so that Ctrl-C reaches it promptly.
WAKE_S = 0.5


@dataclass
class SlotRun:
    """One job's stay in a slot."""

    job: SweepJob
    tag: Any  # the caller's handle (the Optuna trial)
    started: float  # epoch seconds (time.time())
    ended: float | None = None
    job_return: JobReturn | None = None


class TrialSlots:
    def __init__(self, launcher: Any, size: int):
        self.launcher = launcher
        self.size = max(1, int(size))
        self.running: dict[int, tuple[threading.Thread, SlotRun]] = {}
        self.timeline: list[SlotRun] = []
        self._ended: queue.Queue[SlotRun] = queue.Queue()

    @property
    def free(self) -> int:
        return self.size - len(self.running)

    def start(self, job: SweepJob, tag: Any) -> None:
        """Launch `job` in a free slot; `wait()` gives it back when it ends."""
        assert self.free > 0, "no free slot"
        run = SlotRun(job, tag, time.time())
        thread = threading.Thread(target=self._run, args=(run,), name=f"trial-{job.num}", daemon=True)
        self.running[job.num] = (thread, run)
        self.timeline.append(run)
        thread.start()

    def _run(self, run: SlotRun) -> None:
        try:
            run.job_return = launch_numbered(self.launcher, [run.job])[0]
        except BaseException as exc:  # the launcher itself broke (or was interrupted): the trial failed
            run.job_return = failed_return(run.job.overrides, JobNotRun(f"launcher error: {exc!r}"), run.job)
        finally:
            run.ended = time.time()
            self._ended.put(run)

    def wait(self) -> SlotRun:
        """Block until any running job ends; its slot is free again."""
        while True:
            try:
                run = self._ended.get(timeout=WAKE_S)
            except queue.Empty:
                continue
            thread, _ = self.running.pop(run.job.num)
            thread.join()
            return run

    def cancel(self) -> None:
        """Stop every running job: interrupt each slot's thread, whose launcher then cancels its job."""
        for thread, _ in list(self.running.values()):
            # The launchers cancel their jobs on any exception in their wait loop (KeyboardInterrupt
            # included), but only the main thread receives Ctrl-C: deliver it to each slot's thread.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))
        for thread, _ in list(self.running.values()):
            thread.join(timeout=60)
        self.running.clear()


def idle_slot_seconds(timeline: list[SlotRun], slots: int, sweep_start: float, sweep_end: float,
                      trials: int) -> float:
    """Seconds slots sat empty while trials were still to be run (for bench/async_trials.py).

    Until the last trial has started, every slot should be busy: idle time is `slots` x that span
    minus the time jobs ran in it. After the last start, slots drain and nothing is left to give them.
    """
    if not timeline:
        return 0.0
    starts = sorted(r.started for r in timeline)
    last_start = starts[min(trials, len(starts)) - 1]
    busy = sum(max(0.0, min(r.ended or sweep_end, last_start) - r.started) for r in timeline)
    return max(0.0, slots * (last_start - sweep_start) - busy)
