"""What a sweep will cost, before it starts: each point's predicted step time, tokens/s per device, MFU
and device-hours on the cluster it names (`cluster=`, dpo_sweeps/cost/), beside the fit check's verdict,
and the sweep's total. The dry run lists them, for the points that have run too (with the step they
measured beside the prediction where they ran on the cluster's hardware); a real sweep prints the total
before its first job. A local sweep also says how long its jobs take on this machine (`forecast_line`,
cost/forecast.py)."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dpo_sweeps.launchers.jobs import SweepJob
from dpo_sweeps.launchers.preflight import CheckedConfig

log = logging.getLogger("launchers")


def predict_jobs(jobs: Sequence[SweepJob], checks: dict[int, Any] | None = None) -> dict[int, Any]:
    """Each job's Prediction by job number, for the jobs whose config names a cluster; one prediction per
    distinct config (`fit_key`: the settings the cost reads are the estimate's, and train.max_steps). `checks`: the jobs' fit
    checks by number, whose memory estimate the prediction shows."""
    from dpo_sweeps.cost.predict import predict_config, profile_of_config
    from dpo_sweeps.parallel.fit import fit_key

    checked = CheckedConfig()
    cache: dict[str, Any] = {}
    out: dict[int, Any] = {}
    for job in jobs:
        if not job.task_config.get("cluster"):
            continue
        # The estimate's settings, and the steps the device-hours count (the fit check ignores them).
        key = fit_key(job.task_config, job.world_size) + str(job.task_config["train"]["max_steps"])
        if key not in cache:
            cfg = checked.of(job.task_config)
            check = (checks or {}).get(job.num)
            try:
                cache[key] = predict_config(cfg, profile_of_config(cfg), job.world_size,
                                            check.estimate_gib if check is not None else None)
            except (OSError, ValueError) as exc:  # e.g. a hub model not in the local cache
                log.warning("#%d: no cost prediction (%s)", job.num, str(exc).splitlines()[0] if str(exc) else exc)
                cache[key] = None
        if cache[key] is not None:
            out[job.num] = cache[key]
    return out


def total_line(predictions: dict[int, Any]) -> str | None:
    if not predictions:
        return None
    from dpo_sweeps.cost.predict import total_text

    return total_text(list(predictions.values()))


def forecast_line(jobs: Sequence[SweepJob], at_once: Callable[[SweepJob], int]) -> str:
    """How long the jobs take on this machine's CPU, run `at_once(job)` at a time (cost/forecast.py), or why
    there is no forecast; never raises: a forecast never stops a sweep."""
    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.cost.forecast import Planned, forecast_text

    try:  # Config.of, as the run reads it (DPO_SWEEPS_SMOKE's cut included)
        runs = [Planned(Config.of(job.task_config), job.world_size, at_once(job)) for job in jobs]
    except Exception as exc:  # noqa: BLE001
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"{len(jobs)} runs; no forecast ({type(exc).__name__}: {first})"
    return forecast_text(runs, sys.argv[1:])


def measured_beside(job: SweepJob, run_dir: Path, prediction: Any) -> str:
    """What a completed point's run measured, beside its prediction: its step time and the prediction's
    error where it ran on the hardware the cluster profile describes (cluster=cpu: a CPU run on this
    machine; a GPU profile: a GPU run predicted on that profile, i.e. on that GPU), else where it ran."""
    from dpo_sweeps.rundir.summary import read_summary

    summary = read_summary(run_dir)
    measured = summary.metrics.get("perf/step_time_s") if summary is not None else None
    if measured is None:
        return "ran (no measured step time)"
    cluster = job.task_config["cluster"]
    if cluster.get("measured"):
        nodes = set((summary.layout or {}).get("nodes") or [])
        same = summary.device_kind == "cpu" and nodes <= {socket.gethostname()} and bool(nodes)
    else:
        same = summary.device_kind == "gpu" and \
            summary.metrics.get("perf/step_time_predicted_profile") == cluster.get("name")
    if not same:
        where = summary.device_kind or "unknown hardware"
        return f"ran on other hardware ({where}): measured {measured:.3g} s there"
    step = prediction.step_time_s
    inside = "inside" if step.low <= measured <= step.high else "OUTSIDE"
    return (f"ran on this hardware: measured {measured:.3g} s, {100 * (step.value - measured) / measured:+.0f}% "
            f"off, {inside} the interval")
