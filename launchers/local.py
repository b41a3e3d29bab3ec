"""`hydra/launcher=local`: a sweep's jobs on this machine, as many at once as it holds.

Each job is a submitit local job with one process per rank (`resources.nproc_per_node`; one
node only). Jobs start as soon as their devices are free (`launchers.placement`): on GPUs, one
GPU per rank with a per-job `CUDA_VISIBLE_DEVICES`, so concurrent jobs never share a GPU
(submitit's local executor alone gives every job the same GPUs); on a CPU-only machine,
`cpus_per_rank` cores per rank, pinned. `max_concurrent_jobs` caps the count further: set it to
1 when runs must not compete for memory bandwidth (fair speed measurements on CPU).
Probes (`probe.steps`) that need the same ranks share jobs: each such job's ranks start once and
run several probes in turn (`probes_per_job`; by default the probes spread evenly over the jobs
the machine runs at once; launchers.jobs.probe_batches, dpo_sweeps/runtime/shared_ranks.py).

A job that fails does not stop the others; a job that dies without a summary.json gets one.

Ctrl-C (or SIGHUP, the terminal closing) stops the running jobs as it stops a single run: their ranks
save a checkpoint and end `interrupted`, the sweep waits for them (up to STOP_GRACE_S; a second
Ctrl-C kills them at once), and the same command goes on from there. submitit's job controller
starts with the terminal's signals ignored (a shell `trap`, so that it works from any thread): on a
Ctrl-C it would print a traceback and SIGKILL the ranks a second later, in mid-checkpoint. The ranks
take the signals back (`_terminal_signals`) unless the sweep itself ignored them (`nohup`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn

from dpo_sweeps.errors import Failure
from dpo_sweeps.launchers.base import (
    JobNotRun,
    SweepLauncher,
    failed_return,
    log,
    probes_per_job_of,
)
from dpo_sweeps.launchers.collect import collect_unit, runs_written
from dpo_sweeps.launchers.cost_screen import SweepTiming
from dpo_sweeps.launchers.jobs import PointLabels, SweepJob, probe_batches
from dpo_sweeps.launchers.placement import DevicePool, usable_cpus, visible_gpus
from dpo_sweeps.launchers.progress import progress_line
from dpo_sweeps.parallel.allocator import chosen_allocator, preload_line
from dpo_sweeps.rundir.summary import read_summary
from dpo_sweeps.runtime.context import new_attempt
from dpo_sweeps.runtime.watchdog import STALE_S, hang_verdict

# How long a Ctrl-C'd sweep waits for its running jobs to checkpoint and stop before it kills them.
STOP_GRACE_S = 300.0
# dpo_sweeps.runtime.signals' own, restated: that module loads torch, which the sweep process does not.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP)
# Run by the shell that starts submitit's controller: it, and so the ranks it starts, ignore them.
IGNORE_TERMINAL_SIGNALS = "trap '' INT HUP"


def _every_rank_stopped(job: SweepJob, started: float) -> Failure | None:
    """The `hang` failure of a job none of whose ranks can say it (all stopped: no watchdog runs), or None.
    `started`: when the job started (time.monotonic()); heartbeats left from before it are not its own."""
    resources = job.section("resources")
    bound = (resources.hang_timeout_s or resources.collective_timeout_s) + STALE_S
    return hang_verdict(job.run_dir, bound, job.world_size, since=time.time() - (time.monotonic() - started))


class LocalLauncher(SweepLauncher):
    _EXECUTOR = "local"

    def __init__(
        self,
        submitit_folder: str,
        timeout_min: float = 720,
        cpus_per_rank: int = 1,
        max_concurrent_jobs: int | None = None,
        cpus: Sequence[int] | None = None,
        gpus: Sequence[str | int] | None = None,
        stderr_to_stdout: bool = False,
        poll_interval_s: float = 0.2,
        probes_per_job: int | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise ValueError(
                f"hydra.launcher.{', hydra.launcher.'.join(sorted(unknown))}: not settings of the local launcher "
                "(accepted: timeout_min, cpus_per_rank, max_concurrent_jobs, cpus, gpus, stderr_to_stdout, "
                "poll_interval_s, probes_per_job). For SLURM settings add hydra/launcher=slurm to the command line")
        super().__init__(submitit_folder=submitit_folder, timeout_min=timeout_min)
        if not isinstance(cpus_per_rank, int) or cpus_per_rank < 1:
            raise ValueError(f"hydra.launcher.cpus_per_rank: got {cpus_per_rank!r} (accepted: an integer >= 1)")
        if max_concurrent_jobs is not None and (not isinstance(max_concurrent_jobs, int) or max_concurrent_jobs < 1):
            raise ValueError(f"hydra.launcher.max_concurrent_jobs: got {max_concurrent_jobs!r} "
                             "(accepted: null for as many as the machine holds, or an integer >= 1)")
        self.probes_per_job = probes_per_job_of(probes_per_job)
        self.submitit_folder = submitit_folder
        self.timeout_min = timeout_min
        self.cpus_per_rank = cpus_per_rank
        self.max_concurrent_jobs = max_concurrent_jobs
        self.cpus = list(cpus) if cpus is not None else None
        self.gpus = [str(g) for g in gpus] if gpus is not None else None
        self.stderr_to_stdout = stderr_to_stdout
        self.poll_interval_s = poll_interval_s
        # The devices jobs are placed on: one pool for every launch_jobs call of this launcher, so that
        # calls from several threads (the Optuna sweeper's asynchronous trials) never share a core or GPU.
        self._devices: DevicePool | None = None
        self._devices_lock = threading.Lock()
        self._checked: dict[str, str | None] = {}  # check_job's verdict by the job's resources
        self._sweep_process: tuple[int, str] | None = None  # (pid, start time) of the process that launched
        self._terminal_signals: list[int] = []  # those the sweep process does not ignore: its ranks catch them
        # The grid sweeper's launch is the whole sweep, or a find_best stage (its name, then): it says how long
        # it will take here (SweepTiming). An Optuna trial is launched alone: its study says it (optuna_loop.py).
        self.forecasts_next_launch: bool | str = False

    def __getstate__(self) -> dict:
        # submitit pickles the launcher into every job; the job side needs neither the pool nor its lock.
        state = dict(self.__dict__)
        state.update(_devices=None, _devices_lock=None, _checked={})
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._devices_lock = threading.Lock()

    def __call__(self, runs: Any, singleton_state: Any, placement: Any = None) -> Any:  # type: ignore[override]
        """The job side (see SweepLauncher): the job's ranks stop when the sweep process is gone (a
        killed sweep leaves no run training on its own), as after a SIGTERM: checkpoint, `preempted`."""
        if self._sweep_process is not None:
            threading.Thread(target=_stop_with, args=(self._sweep_process,), name="sweep-watch", daemon=True).start()
        for sig in self._terminal_signals:  # the controller's `trap` ignored them for us: take them back
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        return super().__call__(runs, singleton_state, placement)

    def _pool(self) -> DevicePool:
        return DevicePool(cpus=self.cpus if self.cpus is not None else usable_cpus(),
                          gpus=self.gpus if self.gpus is not None else visible_gpus(),
                          cpus_per_rank=self.cpus_per_rank)

    @staticmethod
    def _uses_gpus(job: SweepJob, pool: DevicePool) -> bool:
        device = job.section("resources").device
        return device == "cuda" or (device == "auto" and bool(pool.gpus))

    def describe(self) -> str:
        pool = self._pool()
        cap = f", at most {self.max_concurrent_jobs} jobs at once" if self.max_concurrent_jobs else ""
        return (f"local: {len(pool.cpus)} CPU cores ({self.cpus_per_rank} per rank on CPU)"
                + (f", GPUs {','.join(pool.gpus)} (one per rank)" if pool.gpus else "") + cap)

    def check_job(self, job: SweepJob) -> str | None:
        """Why this machine cannot run the job (it depends on the job's resources only: asked once per kind)."""
        key = json.dumps(job.task_config["resources"], sort_keys=True)
        if key not in self._checked:
            self._checked[key] = self._check_resources(job)
        return self._checked[key]

    def _check_resources(self, job: SweepJob) -> str | None:
        resources = job.section("resources")
        if resources.nodes != 1:
            return (f"resources.nodes: got {resources.nodes!r}; the local launcher runs a job on this machine only "
                    "(accepted: 1; for several nodes use hydra/launcher=slurm)")
        pool = self._pool()
        if resources.device == "cuda" and not pool.gpus:
            return "resources.device: cuda, but this machine has no visible GPU (accepted here: cpu or auto)"
        return pool.cannot_hold(job.world_size, self._uses_gpus(job, pool))

    def jobs_at_once(self, job: SweepJob) -> int | None:
        """How many jobs like `job` this machine runs at once, for a forecast of its CPU (an Optuna study's);
        None where they run on its GPUs."""
        pool = self._pool()
        return None if self._uses_gpus(job, pool) else self._slots(job, pool)

    def _slots(self, job: SweepJob, pool: DevicePool) -> int:
        """How many jobs like this one run at once on `pool` (probe batches are spread over them)."""
        slots = pool.slots(job.world_size, self._uses_gpus(job, pool))
        return min(slots, self.max_concurrent_jobs or slots)

    def launch_jobs(self, jobs: Sequence[SweepJob]) -> list[JobReturn]:
        import submitit

        assert self.config is not None
        with self._devices_lock:
            if self._devices is None:
                self._devices = self._pool()
            pool = self._devices
        executor = submitit.AutoExecutor(cluster="local", folder=self.submitit_folder)
        self._sweep_process = (os.getpid(), process_start(os.getpid()))
        self._terminal_signals = [int(sig) for sig in TERMINAL_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN]
        results: dict[int, JobReturn] = {}
        pending = deque(probe_batches(jobs, lambda job: self._slots(job, pool), self.probes_per_job))
        label = PointLabels([job.overrides for job in jobs])
        running: dict[int, _Running] = {}  # by the first job of each
        hung: dict[int, Failure] = {}  # jobs cancelled because every rank stopped: their failure
        log.info("local launcher: %d jobs on %d CPU cores%s%s, into %s", len(jobs), len(pool.cpus),
                 f" and {len(pool.gpus)} GPUs" if pool.gpus else "",
                 f", at most {self.max_concurrent_jobs} at once" if self.max_concurrent_jobs else "",
                 self.config.hydra.sweep.dir)
        timing = SweepTiming.of_jobs(jobs, [self._uses_gpus(job, pool) for job in jobs], lambda job: self._slots(job, pool),
                                     stage=self.forecasts_next_launch if isinstance(self.forecasts_next_launch, str)
                                     else "") if self.forecasts_next_launch else None
        self.forecasts_next_launch = False
        try:
            while pending or running:
                self._start_what_fits(executor, jobs, pool, pending, running, results, label)
                for key, job in running.items():
                    current = job.current(jobs)
                    if key not in hung and current is not None and (verdict := _every_rank_stopped(current, job.started)):
                        log.error("#%d: %s; cancelling the job", current.num, verdict.message)
                        hung[key] = verdict
                        _signal_ranks(job.submitted, signal.SIGKILL)
                for key in [key for key, job in running.items() if job.submitted.done()]:
                    job = running.pop(key)
                    with self._devices_lock:
                        pool.give_back(job.placement)
                    members = [jobs[i] for i in job.unit]
                    returns, not_run = collect_unit(members, job.submitted, job.started, job.attempts,
                                                          self.timeout_min, known_failure=hung.pop(key, None))
                    for i, ret in zip(job.unit, returns):
                        results[i] = ret
                        log.info(progress_line(jobs[i], ret, job.elapsed(jobs[i]), len(results), len(jobs)))
                    if timing is not None:
                        ran = [i for p, i in enumerate(job.unit) if p not in not_run]
                        # The runs of a probe batch share one start-up: each is timed at its share of the job.
                        share = (time.monotonic() - job.started) / max(1, len(ran)) if len(job.unit) > 1 else None
                        for i in ran:
                            timing.ended(jobs[i], share or job.elapsed(jobs[i]), len(jobs) - len(results))
                    if not_run:  # a probe batch stopped at a failed run: the rest get processes of their own
                        pending.appendleft([job.unit[p] for p in not_run])
                if pending or running:
                    time.sleep(self.poll_interval_s)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) and running:
                _let_stop([job.submitted for job in running.values()])
            left = [job for job in running.values() if not job.submitted.done()]
            for job in left:
                _signal_ranks(job.submitted, signal.SIGKILL)
            with self._devices_lock:
                for job in running.values():
                    pool.give_back(job.placement)
            if left:
                log.warning("%d local jobs were still running: killed", len(left))
            raise
        return [results[i] for i in range(len(jobs))]

    def _start_what_fits(self, executor: Any, jobs: Sequence[SweepJob], pool: DevicePool, pending: deque,
                         running: dict, results: dict[int, JobReturn], label: PointLabels) -> None:
        """Start pending jobs, in order, while devices are free (a later, smaller job may go first)."""
        full: set[tuple[int, bool]] = set()  # shapes that found no room in this pass: their later jobs neither
        for unit in list(pending):
            if self.max_concurrent_jobs and len(running) >= self.max_concurrent_jobs:
                return
            job = jobs[unit[0]]  # a probe batch's jobs need the same ranks
            use_gpus = self._uses_gpus(job, pool)
            if (job.world_size, use_gpus) in full:
                continue
            impossible = pool.cannot_hold(job.world_size, use_gpus)
            if impossible:
                pending.remove(unit)
                for i in unit:
                    results[i] = failed_return(jobs[i].overrides, JobNotRun(impossible), jobs[i])
                continue
            with self._devices_lock:
                placement = pool.take(job.world_size, use_gpus)
            if placement is None:
                full.add((job.world_size, use_gpus))
                continue
            pending.remove(unit)
            # the job's ranks are its tasks: they start with the run's malloc (resources.cpu_allocator)
            allocator = chosen_allocator(job.section("resources").cpu_allocator, use_gpus, job.world_size)
            preload = [line] if (line := preload_line(allocator)) else []
            executor.update_parameters(tasks_per_node=job.world_size, nodes=1, gpus_per_node=0,
                                       timeout_min=self.timeout_min, stderr_to_stdout=self.stderr_to_stdout,
                                       local_setup=[IGNORE_TERMINAL_SIGNALS, *preload])
            members = [jobs[i] for i in unit]
            for member in members:
                member.run_dir.mkdir(parents=True, exist_ok=True)
            attempts = [new_attempt() for _ in members]
            submitted = executor.submit(self, *self._submit_args(members, attempts, placement))
            running[unit[0]] = _Running(unit, submitted, placement, time.monotonic(), attempts)
            if len(members) == 1:
                log.info("#%d started: %s  (%d ranks; %s; job %s)", job.num, label(job.overrides), job.world_size,
                         placement.describe(), submitted.job_id)
            else:
                log.info("#%s started in turn, sharing one start-up: %s  (%d ranks; %s; job %s)",
                         ", #".join(str(m.num) for m in members), "; ".join(label(m.overrides) for m in members),
                         job.world_size, placement.describe(), submitted.job_id)


def _ranks_of(submitted: Any) -> list[int]:
    """The rank processes of a local job: the tasks of the controller its shell started."""
    def children(pid: int) -> list[int]:
        try:
            return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except (OSError, ValueError):
            return []
    return [rank for controller in children(int(submitted.job_id)) for rank in children(controller)]


def _signal_ranks(submitted: Any, sig: signal.Signals) -> None:
    for pid in _ranks_of(submitted):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _let_stop(submitted: list[Any]) -> None:
    """After a Ctrl-C: the running jobs' ranks stop as a single run does (the signal reached them too,
    from the terminal, or now from here); wait for them, up to STOP_GRACE_S or a second Ctrl-C."""
    log.warning("stopping %d running jobs at a checkpoint (Ctrl-C again to kill them now)", len(submitted))
    for job in submitted:
        _signal_ranks(job, signal.SIGINT)  # a rank that has it already is stopping: it says so and goes on
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        while time.monotonic() < deadline and not all(job.done() for job in submitted):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass


def process_start(pid: int) -> str:
    """When process `pid` started (field 22 of /proc/PID/stat): with the pid, names one process for good."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _stop_with(sweep: tuple[int, str], poll_s: float = 1.0) -> None:
    """Send this rank SIGTERM once the sweep process (pid, start time) has ended."""
    pid, started = sweep
    while started and process_start(pid) == started:
        time.sleep(poll_s)
    if started:
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class _Running:
    """A started job: the sweep's jobs it runs (one, or a probe batch in turn) and where."""

    unit: list[int]
    submitted: Any
    placement: Any
    started: float
    attempts: list[str]  # the attempt id this launch gave each run

    def current(self, jobs: Sequence[SweepJob]) -> SweepJob | None:
        """The run the job is on (None: all of its runs wrote their summary)."""
        done = runs_written([jobs[i] for i in self.unit], self.attempts)
        return jobs[self.unit[done]] if done < len(self.unit) else None

    def elapsed(self, job: SweepJob) -> float:
        """How long the run took: the job's time, or in a probe batch the run's own (summary.json wall_s)."""
        summary = read_summary(job.run_dir) if len(self.unit) > 1 else None
        wall = summary.wall_s if summary is not None else None
        return wall if isinstance(wall, (int, float)) else time.monotonic() - self.started
