"""The prediction of one config (a sweep point or a run): its Workload and Layout from the resolved config,
on its cluster profile (`cluster=`), with the fit check's memory estimate and the run's device-hours.

From the config alone, as the fit check (parallel/fit.py): the architecture built on the meta device, every
row `data.max_length` long (runs pad to their longest row: an upper bound on the step), the response half
of each row scored when the LM head runs on response positions only (`train.logps_chunk_size` > 0).
"""

from __future__ import annotations

from dataclasses import replace

from dpo_sweeps.config.schema import ClusterConfig
from dpo_sweeps.cost.cpu_profile import cpu_device_profile
from dpo_sweeps.cost.profile import DeviceProfile, builtin_cluster, profile_name_of_device
from dpo_sweeps.cost.step_time import Estimate, Layout, Prediction, Workload, predict_step
from dpo_sweeps.dpo.losses import uses_reference
from dpo_sweeps.parallel.plan import DTYPES, ParallelPlan, resolve_plan

RESPONSE_FRACTION = 0.5  # as the fit check's estimate (memory_estimate.run_shape_of)


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


def workload_of(cfg, plan: ParallelPlan, shape) -> Workload:
    """One rank's step of a DPO config (`shape`: memory_estimate.ModelShape of its architecture)."""
    train = cfg.train
    rows = train.micro_batch_size * (1 if train.share_prompt else 2)
    length = cfg.data.max_length
    positions = rows * length
    scored = positions if train.logps_chunk_size == 0 else int(positions * RESPONSE_FRACTION)
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
                  compute=plan.compute)


def profile_of_config(cfg) -> DeviceProfile | None:
    """The cluster a config names (its measured numbers for cluster=cpu, on a rank's threads), or None."""
    if cfg.cluster is None:
        return None
    threads = None
    if cfg.cluster.measured:
        from dpo_sweeps.cost.cpu_profile import default_threads

        threads = cfg.resources.threads_per_rank or default_threads(cfg.resources.nproc_per_node)
    return device_profile(cfg.cluster, threads)


def predict_config(cfg, profile: DeviceProfile, world_size: int | None = None,
                   peak_memory_gib: float | None = None, shape=None) -> Prediction:
    """The prediction of a typed, resolved config on `profile`: step time, tokens/s per device, MFU and the
    device-hours of its train.max_steps (probe.steps for a probe), with `peak_memory_gib` beside them.
    `shape`: the model's ModelShape where it is built already (a run); else the fit check's, from the config."""
    plan = resolve_plan(cfg, world_size)
    if shape is None:
        from dpo_sweeps.parallel.fit import model_shape_of

        shape = model_shape_of(cfg)
    prediction = predict_step(workload_of(cfg, plan, shape), layout_of(plan, cfg.resources.nproc_per_node), profile)
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
        step = predict_config(cfg, profile, world_size, shape=shape).step_time_s
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
    from dpo_sweeps.cost.cpu_profile import cached_measurement, default_threads, profile_of

    threads = cfg.resources.threads_per_rank or default_threads(cfg.resources.nproc_per_node)
    found = cached_measurement(threads)
    return profile_of(builtin_cluster("cpu"), found) if found is not None else None


def total_text(predictions: list[Prediction]) -> str:
    """The sweep's total device-hours, with its interval (the points' intervals summed: a worst case)."""
    total = Estimate(sum(p.device_hours.value for p in predictions), sum(p.device_hours.low for p in predictions),
                     sum(p.device_hours.high for p in predictions))
    return (f"predicted total: {total.value:.3g} device-hours [{total.low:.3g}-{total.high:.3g}] "
            f"for {len(predictions)} runs")
