"""The prediction of one config (a sweep point or a run): its Workload and Layout from the resolved config,
on its cluster profile (`cluster=`), with the fit check's memory estimate and the run's device-hours.

From the config alone, as the fit check (parallel/fit.py): the architecture built on the meta device, and
every pair as long as truncation leaves a long one (`micro_batch_rows`, data/rows.py: runs pad to their
longest row, so for data cut to its limits this is an upper bound on the step).
"""

from __future__ import annotations

from dataclasses import replace

from dpo_sweeps.config.schema import ClusterConfig
from dpo_sweeps.cost.cpu_profile import cpu_device_profile
from dpo_sweeps.cost.profile import DeviceProfile, builtin_cluster, profile_name_of_device
from dpo_sweeps.cost.step_time import Estimate, Layout, Prediction, Workload, predict_step
from dpo_sweeps.data.rows import longest_rows_of
from dpo_sweeps.dpo.losses import uses_reference
from dpo_sweeps.parallel.plan import DTYPES, ParallelPlan, resolve_plan


def device_profile(cluster: ClusterConfig, threads: int | None = None) -> DeviceProfile:
    """The numbers of a checked cluster profile; cluster=cpu measures (once, cached) what it leaves null."""
    cluster.check()
    if cluster.measured:
        return cpu_device_profile(cluster, threads)
    return DeviceProfile(
        name=cluster.name, gpus_per_node=cluster.gpus_per_node, memory_gib=cluster.device_memory_gib,
        memory_bandwidth=cluster.memory_bandwidth_gb_s * 1e9,
        peak_flops={k: v * 1e12 for k, v in cluster.peak_tflops.items()},
        intra_bandwidth=cluster.intra_node_gb_s * 1e9, intra_latency=cluster.intra_node_latency_us * 1e-6,
        inter_bandwidth=cluster.inter_node_gb_s * 1e9, inter_latency=cluster.inter_node_latency_us * 1e-6)


def micro_batch_rows(cfg) -> tuple[int, int, int]:
    """(rows, their length, scored positions) of one micro-batch at the worst case the prediction assumes,
    every pair long (data/rows.py's `longest_rows_of`, as the memory estimate takes it); the LM
    head scores the response positions (train.logps_chunk_size > 0) or every one."""
    rows, length, responses = longest_rows_of(cfg)
    return rows, length, rows * length if cfg.train.logps_chunk_size == 0 else responses


def workload_of(cfg, plan: ParallelPlan, shape) -> Workload:
    """One rank's step of a DPO config (`shape`: memory_estimate.ModelShape of its architecture)."""
    train = cfg.train
    rows, length, scored = micro_batch_rows(cfg)
    positions = rows * length
    return Workload(
        num_layers=shape.num_layers, hidden=shape.hidden, block_params=shape.num_params - shape.root_params,
        head_params=shape.root_params, positions=positions, scored=scored, attention=rows * length * length,
        micro_batches=max(1, train.batch_size // (train.micro_batch_size * plan.world_size)),
        recompute="full" if plan.activation_checkpointing else "none",
        reference_forward=uses_reference(cfg.loss) and not train.precompute_reference_logps,
        trained_params=shape.trainable_params, quantized_params=shape.quantized_params,
        quantized_bytes=shape.quantized_bytes + shape.scale_bytes)


def layout_of(plan: ParallelPlan, nproc_per_node: int) -> Layout:
    return Layout(world_size=plan.world_size, ranks_per_node=nproc_per_node, shard_size=plan.shard_size,
                  replicate_size=plan.replicate_size, reshard_after_forward=plan.reshard_after_forward,
                  param_bytes=DTYPES[plan.param_dtype].bytes, reduce_bytes=DTYPES[plan.reduce_dtype].bytes,
                  compute=plan.compute, fully_sharded=plan.fully_sharded)


def rank_threads(cfg) -> int:
    """The threads one rank of a config computes on (resources.threads_per_rank, else its share of the cores)."""
    from dpo_sweeps.cost.cpu_profile import default_threads

    return cfg.resources.threads_per_rank or default_threads(cfg.resources.nproc_per_node)


def profile_of_config(cfg) -> DeviceProfile | None:
    """The cluster a config names (its measured numbers for cluster=cpu, on a rank's threads), or None."""
    if cfg.cluster is None:
        return None
    return device_profile(cfg.cluster, rank_threads(cfg) if cfg.cluster.measured else None)


def predict_config(cfg, profile: DeviceProfile, world_size: int | None = None,
                   peak_memory_gib: float | None = None, shape=None, time_passes: bool = True) -> Prediction:
    """The prediction of a typed, resolved config on `profile`: step time, tokens/s per device, MFU and the
    device-hours of its train.max_steps (probe.steps for a probe), with `peak_memory_gib` beside them.
    `shape`: the model's ModelShape where it is built already (a run); else the fit check's, from the config.
    On a measured profile the point's passes are timed here (cpu_passes.py) unless cached; `time_passes`
    false: cached ones only (a run, which must not spend its time or memory on them), else ValueError."""
    plan = resolve_plan(cfg, world_size)
    if shape is None:
        from dpo_sweeps.parallel.fit import model_shape_of

        shape = model_shape_of(cfg)
    work = workload_of(cfg, plan, shape)
    passes = None
    if profile.measured:
        from dpo_sweeps.cost.cpu_passes import cached_passes, measured_passes, pass_shape

        key = pass_shape(cfg, plan, rank_threads(cfg))
        passes = measured_passes(key) if time_passes else cached_passes(key)
        if passes is None:
            raise ValueError("cluster=cpu: this point's passes were not timed before it ran (a sweep or dry run "
                             "with cluster=cpu times them)")
    prediction = predict_step(work, layout_of(plan, cfg.resources.nproc_per_node), profile, passes=passes)
    steps = cfg.probe.steps or cfg.train.max_steps
    hours = prediction.step_time_s.scaled(steps * plan.world_size / 3600)
    return replace(prediction, device_hours=hours, peak_memory_gib=peak_memory_gib)


def predicted_step_metrics(cfg, world_size: int, device, shape) -> dict:
    """summary.json's perf/step_time_predicted_s (and its interval, _low_s and _high_s) of a run: on its
    cluster=, else on the profile of the GPU it runs on, else on this machine's cached CPU profile (none
    until a sweep with cluster=cpu measured it: perf/step_time_predicted_reason says so). `device`: the
    run's torch.device; `shape`: its model's ModelShape."""
    try:
        device_name = None
        if device.type == "cuda":
            import torch

            device_name = torch.cuda.get_device_name(device)
        profile = _run_profile(cfg, device_name)
        if profile is None:
            return {"perf/step_time_predicted_s": None, "perf/step_time_predicted_reason":
                    "no profile: name a cluster= (cluster=cpu measures this machine once)"}
        step = predict_config(cfg, profile, world_size, shape=shape, time_passes=False).step_time_s
    except (OSError, ValueError, KeyError) as exc:
        return {"perf/step_time_predicted_s": None, "perf/step_time_predicted_reason": str(exc).splitlines()[0]}
    return {"perf/step_time_predicted_s": step.value, "perf/step_time_predicted_low_s": step.low,
            "perf/step_time_predicted_high_s": step.high, "perf/step_time_predicted_profile": profile.name}


def _run_profile(cfg, device_name: str | None) -> DeviceProfile | None:
    if cfg.cluster is not None and not cfg.cluster.measured:
        return device_profile(cfg.cluster)
    if device_name is not None:  # a GPU
        name = profile_name_of_device(device_name)
        return device_profile(builtin_cluster(name)) if name else None
    from dpo_sweeps.cost.cpu_profile import cached_measurement, profile_of

    found = cached_measurement(rank_threads(cfg))
    return profile_of(builtin_cluster("cpu"), found) if found is not None else None


def total_text(predictions: list[Prediction]) -> str:
    """The sweep's total device-hours, with its interval (the points' intervals summed: a worst case)."""
    total = Estimate(sum(p.device_hours.value for p in predictions), sum(p.device_hours.low for p in predictions),
                     sum(p.device_hours.high for p in predictions))
    return (f"predicted total: {total.value:.3g} device-hours [{total.low:.3g}-{total.high:.3g}] "
            f"for {len(predictions)} runs")
