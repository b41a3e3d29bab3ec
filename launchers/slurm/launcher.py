"""`hydra/launcher=slurm`: one SLURM job per run, one task per rank.

A run with `resources.nodes` = N and `resources.nproc_per_node` = P becomes a job of N nodes x
P tasks per node (P GPUs per node when `resources.device=cuda`, unless `gpus_per_node` says
otherwise); hybrid_shard then shards within a node and replicates across nodes. Runs of the same
shape go in one job array, at most `array_parallelism` at once. Probes of the same shape may share a
job, run in turn by its ranks (`probes_per_job`; launchers.jobs.probe_batches). Everything else (partition,
account, qos, time limit, CPUs and memory, extra sbatch and srun arguments, a setup block)
comes from `conf/hydra/launcher/slurm.yaml` and can be overridden on the command line as
`hydra.launcher.<key>=...`.

srun runs with `--kill-on-bad-exit=1` by default: a rank that dies takes its job down instead of
leaving the others waiting on a collective. A job that ends without rank 0 writing summary.json
(time limit, preemption, out-of-memory kill, node failure) gets a failed one from the launcher,
with the failure kind read from SLURM's job state; ranks that ended without a result are named,
with their node (a rank 0 lost with the first node gets its failed summary from a rank on another
node: dpo_sweeps/runtime/lost_rank0.py). When a node of a job fails, SLURM requeues the job
(JobRequeue) to run again once enough nodes are up; a job whose run has already recorded the attempt
failed (not preempted, not timed out), or that sacct shows ended NODE_FAIL, is cancelled instead and
recorded `node_failure`: running the sweep again resumes it. Ctrl-C cancels the sweep's jobs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.core.utils import JobReturn

from dpo_sweeps.errors import Failure, FailureKind
from dpo_sweeps.launchers.base import (
    JobNotRun,
    SweepLauncher,
    failed_return,
    log,
    probes_per_job_of,
    task_overrides,
)
from dpo_sweeps.launchers.collect import collect_unit, runs_written
from dpo_sweeps.launchers.jobs import PointLabels, SweepJob, probe_batches
from dpo_sweeps.launchers.progress import progress_line
from dpo_sweeps.launchers.slurm.gpus import query_partition_gpus
from dpo_sweeps.parallel.allocator import chosen_allocator, preload_line
from dpo_sweeps.redaction import secrets_in_text
from dpo_sweeps.rundir.summary import Status, Summary, read_summary, rewrite_summary, write_summary
from dpo_sweeps.runtime.context import new_attempt

# Launcher keys submitit knows without the "slurm_" prefix (hydra-submitit-launcher does the same).
GENERIC_KEYS = ("timeout_min", "cpus_per_task", "mem_gb", "name", "stderr_to_stdout")
# Per-run keys: they come from each run's resources.*, never from the launcher config.
PER_RUN_KEYS = {"nodes": "resources.nodes", "tasks_per_node": "resources.nproc_per_node"}


def refused(job: SweepJob, error: BaseException) -> JobReturn:
    """A job sbatch would not take: its summary.json says failed (crash), with sbatch's reason."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    reason = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else type(error).__name__)
    message = f"sbatch refused the job: {reason}"
    write_summary(job.run_dir, Summary(Status.FAILED, Failure(FailureKind.CRASH, message, started=False),
                                       task_overrides(job), job.task_config, {}, written_by="launcher: not submitted"))
    return failed_return(job.overrides, JobNotRun(message), job)


# How long submitit waits for task 0's result file once the job has ended (its default, 15 s, is for slow
# shared file systems). A rank 0 lost with its node never writes one, and the run's summary.json, not that
# file, is what the launcher reads the run's end from.
RESULT_WAIT_S = 3


# Failure kinds after which a requeued job is meant to run again (submitit requeues it itself).
REQUEUED_KINDS = ("preempted", "timeout")


def failed_but_held(job: SweepJob, submitted: Any, attempt: str) -> bool:
    """Rank 0 recorded this attempt failed for good, yet SLURM holds the job pending again: it requeued it
    after a node failure."""
    summary = read_summary(job.run_dir, attempt)
    if summary is None or summary.status != Status.FAILED:
        return False
    if summary.failure is not None and summary.failure.kind in REQUEUED_KINDS:
        return False
    return str(submitted.state).upper().startswith(("PENDING", "REQUEUED"))


def node_failed(job_ids: Sequence[str]) -> set[str]:
    """Which of these jobs SLURM ended in any run as NODE_FAIL (sacct -D: the records before each requeue
    too); one sacct call for all of them."""
    if not job_ids:
        return set()
    try:
        out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
                             capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line.split("|")[0] for line in out.splitlines() if "NODE_FAIL" in line}


def record_node_failure(run_dir: Any) -> None:
    """The run's failed summary.json, with the failure kind node_failure."""
    summary = read_summary(run_dir)
    if summary is None or summary.status != Status.FAILED:
        return
    rewrite_summary(run_dir, summary, failure=dataclasses.replace(summary.failure, kind=FailureKind.NODE_FAILURE))


def secrets_by_environment(line: str) -> str:
    """A setup line (hydra.launcher.setup) with each secret in it (dpo_sweeps/redaction.py) replaced by the
    expansion of an environment variable set here to hold it: sbatch passes the submitting process's
    environment on to the batch script, so the job gets the secret, and the script submitit writes into
    the sweep directory does not. The expansion is written for where it stands: unquoted, inside double
    quotes or inside single quotes (where the shell expands nothing, so the quotes are closed around it)."""
    for secret in sorted(secrets_in_text(line), key=len, reverse=True):
        name = f"DPO_SWEEPS_SETUP_{hashlib.sha256(secret.encode()).hexdigest()[:8].upper()}_SECRET"
        os.environ[name] = secret
        out, quote, i = [], None, 0
        while i < len(line):
            if line.startswith(secret, i):
                out.append({None: f'"${{{name}}}"', '"': f"${{{name}}}", "'": f"'\"${{{name}}}\"'"}[quote])
                i += len(secret)
                continue
            char = line[i]
            if char == "\\" and quote != "'" and i + 1 < len(line):
                out.append(line[i:i + 2])
                i += 2
                continue
            if char in "'\"" and quote in (None, char):
                quote = None if quote == char else char
            out.append(char)
            i += 1
        line = "".join(out)
    return line


class SlurmLauncher(SweepLauncher):
    _EXECUTOR = "slurm"

    def __init__(
        self,
        submitit_folder: str,
        gpus_per_node: int | None = None,
        array_parallelism: int = 256,
        max_num_timeout: int = 0,
        poll_interval_s: float = 5.0,
        probes_per_job: int | None = None,
        **params: Any,
    ) -> None:
        for key, where in PER_RUN_KEYS.items():
            if params.pop(key, None) is not None:
                raise ValueError(f"hydra.launcher.{key}: set by each run's {where}, not by the launcher "
                                 f"(accepted: null; override {where} instead)")
        if gpus_per_node is not None and (not isinstance(gpus_per_node, int) or gpus_per_node < 0):
            raise ValueError(f"hydra.launcher.gpus_per_node: got {gpus_per_node!r} "
                             "(accepted: null for one GPU per rank when resources.device=cuda, or an integer >= 0)")
        super().__init__(submitit_folder=submitit_folder, **params)
        self.probes_per_job = probes_per_job_of(probes_per_job)
        self.submitit_folder = submitit_folder
        self.gpus_per_node = gpus_per_node
        self.array_parallelism = array_parallelism
        self.max_num_timeout = max_num_timeout
        self.poll_interval_s = poll_interval_s
        self.sbatch_params = {k: v for k, v in self.params.items() if k != "submitit_folder"}
        self._partition_gpus: dict[str | None, int] = {}  # sinfo's answer, for resources.device=auto

    def _gpus_per_node(self, job: SweepJob) -> int:
        """One GPU per rank for device=cuda, and for auto where the partition has GPUs (gpus.py)."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        resources = job.section("resources")
        device = resources.device
        if device == "auto":
            partition = self.sbatch_params.get("partition")
            if partition not in self._partition_gpus:
                found = self._partition_gpus[partition] = query_partition_gpus(partition)
                log.info("resources.device=auto: %s has %d GPUs per node, so jobs ask for %s",
                         partition or "the default partition", found, "one per rank" if found else "none (CPU)")
            device = "cuda" if self._partition_gpus[partition] else "cpu"
        return resources.nproc_per_node if device == "cuda" else 0

    def _shape(self, job: SweepJob) -> tuple[int, int, int, str]:
        resources = job.section("resources")
        gpus = self._gpus_per_node(job)
        # auto is decided here, on the machine that submits: the nodes are taken to have its libraries
        allocator = chosen_allocator(resources.cpu_allocator, gpus > 0, resources.world_size)
        return resources.nodes, resources.nproc_per_node, gpus, allocator

    def executor_parameters(self, shape: tuple[int, int, int, str]) -> dict[str, Any]:
        """submitit parameters for jobs of one shape (nodes, tasks per node, GPUs per node, malloc)."""
        nodes, tasks, gpus, allocator = shape
        params: dict[str, Any] = {
            (k if k in GENERIC_KEYS else f"slurm_{k}"): v for k, v in self.sbatch_params.items() if v is not None
        }
        params.update(nodes=nodes, tasks_per_node=tasks, slurm_array_parallelism=self.array_parallelism)
        if gpus:
            params["gpus_per_node"] = gpus
        params["slurm_setup"] = [secrets_by_environment(line) for line in params.get("slurm_setup", [])]
        if line := preload_line(allocator):  # srun starts the tasks with the batch script's environment
            params["slurm_setup"] = [*params["slurm_setup"], line]
        return params

    def describe(self) -> str:
        shown = {k: v for k, v in self.sbatch_params.items()
                 if v not in (None, [], {}) and v is not False and k != "name"}
        shown["array_parallelism"] = self.array_parallelism
        return "SLURM: " + " ".join(f"{k}={v}" for k, v in shown.items())

    def describe_job(self, job: SweepJob) -> str:
        nodes, tasks, gpus, _allocator = self._shape(job)
        return f"{nodes} node{'s' if nodes > 1 else ''} x {tasks} tasks" + (f", {gpus} GPUs/node" if gpus else "")

    def launch_jobs(self, jobs: Sequence[SweepJob]) -> list[JobReturn]:
        import submitit

        assert self.config is not None
        executor = submitit.AutoExecutor(cluster="slurm", folder=self.submitit_folder,
                                         slurm_max_num_timeout=self.max_num_timeout)
        label = PointLabels([job.overrides for job in jobs])
        results: dict[int, JobReturn] = {}
        pending = probe_batches(jobs, lambda job: self.array_parallelism, self.probes_per_job)
        # by the first job of each: its jobs, the SLURM job, when it was submitted, the attempt id of each run
        running: dict[int, tuple[list[int], Any, float, list[str]]] = {}
        cancelled: set[int] = set()  # jobs SLURM requeued after their run failed (failed_but_held)
        try:
            while pending or running:
                self._submit(executor, jobs, pending, running, results, label)
                pending = []
                # submitit's own sacct polls thin out to one a minute as jobs age (and done(force_check=True)
                # does not reach the tasks of a multi-task job): one sacct poll of all the jobs per interval,
                # so that a job that ended is collected within poll_interval_s.
                if running:
                    next(iter(running.values()))[1].watcher.update()
                for key, (unit, sj, _started, attempts) in running.items():
                    last = runs_written([jobs[i] for i in unit], attempts) - 1  # the run that wrote last
                    if (key not in cancelled and last >= 0 and not sj.done()
                            and failed_but_held(jobs[unit[last]], sj, attempts[last])):
                        log.warning("#%d: SLURM requeued SLURM job %s after its run failed: cancelling it",
                                    jobs[unit[last]].num, sj.job_id)
                        sj.cancel(check=False)
                        cancelled.add(key)
                ended = [key for key, (_unit, sj, *_rest) in running.items() if sj.done()]
                lost_nodes = node_failed([str(running[key][1].job_id) for key in ended])  # one sacct call
                for key in ended:
                    unit, sj, started, attempts = running.pop(key)
                    sj.task(0)._results_timeout_s = RESULT_WAIT_S  # submitit's own attribute for that wait
                    # SLURM's job state says whether the time limit ended it (timeout_min=0: no guessing).
                    returns, not_run = collect_unit([jobs[i] for i in unit], sj, started, attempts, timeout_min=0)
                    lost_node = str(sj.job_id) in lost_nodes
                    if lost_node and key not in cancelled:
                        # sacct may already show the job ended (NODE_FAIL) while SLURM holds it requeued (JobRequeue)
                        sj.cancel(check=False)
                    for i, ret in zip(unit, returns):
                        results[i] = ret
                        if lost_node:
                            record_node_failure(jobs[i].run_dir)
                        log.info(progress_line(jobs[i], ret, time.monotonic() - started, len(results), len(jobs)))
                    if not_run:  # a probe batch stopped at a failed run: the rest go in a job of their own
                        pending.append([unit[p] for p in not_run])
                if running or pending:
                    time.sleep(self.poll_interval_s)
        except BaseException:
            for _unit, sj, *_rest in running.values():
                try:
                    sj.cancel(check=False)
                except Exception:
                    pass
            if running:
                log.warning("cancelled %d SLURM jobs of this sweep", len(running))
            raise
        return [results[i] for i in range(len(jobs))]

    def _submit(self, executor: Any, jobs: Sequence[SweepJob], units: list[list[int]], running: dict,
                results: dict[int, JobReturn], label: PointLabels) -> None:
        """Submit the jobs of `units` (each one job, or a probe batch run in turn), one job array per shape."""
        by_shape: Mapping[tuple[int, int, int, str], list[list[int]]] = defaultdict(list)
        for unit in units:
            by_shape[self._shape(jobs[unit[0]])].append(unit)  # a probe batch's jobs need the same ranks
        for shape, shape_units in by_shape.items():
            executor.update_parameters(**self.executor_parameters(shape))
            attempts = {}
            for unit in shape_units:
                for i in unit:
                    jobs[i].run_dir.mkdir(parents=True, exist_ok=True)
                attempts[unit[0]] = [new_attempt() for _ in unit]
            args = [self._submit_args([jobs[i] for i in unit], attempts[unit[0]]) for unit in shape_units]
            try:
                submitted = executor.map_array(self, *zip(*args))
            except Exception as exc:  # sbatch refused (unknown partition, over a limit) or SLURM is down
                for unit in shape_units:
                    for i in unit:
                        results[i] = refused(jobs[i], exc)
                        log.error("#%d not submitted: %s", jobs[i].num, results[i]._return_value)
                continue
            now = time.monotonic()
            for unit, sj in zip(shape_units, submitted):
                running[unit[0]] = (unit, sj, now, attempts[unit[0]])
                log.info("#%s submitted: %s  (%d node(s) x %d tasks%s; SLURM job %s)",
                         ", #".join(str(jobs[i].num) for i in unit), "; ".join(label(jobs[i].overrides) for i in unit),
                         shape[0], shape[1], f", {shape[2]} GPUs/node" if shape[2] else "", sj.job_id)
