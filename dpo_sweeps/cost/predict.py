"""The prediction of one config (a sweep point or a run): its Workload and Layout from the resolved config,
on its cluster profile (`cluster=`), with the fit check's memory estimate and the run's device-hours.

The architecture is the fit check's (parallel/fit.py, built on the meta device). The step is expected from
the run's own pairs (data_lengths.py: their lengths as the run tokenizes them, batched and padded as its
collator will, or packed into rows under train.packing) and, beside it, at its worst: every pair as long as
truncation leaves a long one (`micro_batch_rows`, data/rows.py), padded, or packed as the row budget allows,
an upper bound on the step that the memory estimate also assumes.

train.compile is priced as eager: the passes are timed (cluster=cpu) and the calibration was fitted (GPU
profiles) without torch.compile, whose gain on a step has not been measured against them; the prediction
says so (`Prediction.compiled_as_eager`), and its first step's compile is left out, as perf/step_time_s leaves it.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from dpo_sweeps.config.schema import ClusterConfig
from dpo_sweeps.cost.cpu_passes import MeasuredPasses
from dpo_sweeps.cost.cpu_profile import cpu_device_profile
from dpo_sweeps.cost.data_lengths import DataLengths, longest_micro_batch
from dpo_sweeps.cost.profile import DeviceProfile, builtin_cluster, profile_name_of_device
from dpo_sweeps.cost.step_time import Estimate, Layout, Prediction, Workload, predict_step
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
    every pair long (data/rows.py's `longest_rows_of`, as the memory estimate takes it), packed under
    train.packing as the row budget allows (data_lengths.py `longest_micro_batch`); the LM head scores the
    response positions (train.logps_chunk_size > 0) or every one."""
    mb = longest_micro_batch(cfg)
    return mb.rows, mb.width, mb.positions if cfg.train.logps_chunk_size == 0 else mb.response_tokens


def workload_of(cfg, plan: ParallelPlan, shape) -> Workload:
    """One rank's step of a DPO config (`shape`: memory_estimate.ModelShape of its architecture)."""
    train = cfg.train
    rows, length, scored = micro_batch_rows(cfg)
    positions = rows * length
    return Workload(
        num_layers=shape.num_layers, hidden=shape.hidden, block_params=shape.num_params - shape.root_params,
        head_params=shape.root_params, positions=positions, scored=scored, attention=rows * length * length,
        trained_tensors=shape.trained_tensors,
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
                   peak_memory_gib: float | None = None, shape=None, time_passes: bool = True,
                   lengths: DataLengths | None = None, read_data: bool = True) -> Prediction:
    """The prediction of a typed, resolved config on `profile`: step time, tokens/s per device, MFU and the
    device-hours of its train.max_steps (probe.steps for a probe), with `peak_memory_gib` beside them.

    The step is expected from the lengths of the run's own pairs (data_lengths.py: a seeded sample,
    tokenized and batched as the run will; `lengths` where read already), beside the worst case, every row at
    its longest (`worst_step_time_s`); `read_data` false, or data that cannot be read (why:
    `lengths_reason`), gives the worst case alone. `shape`: the model's ModelShape where it is built already
    (a run); else the fit check's, from the config. On a measured profile the point's passes are timed here
    (cpu_passes.py) unless cached; `time_passes` false: cached ones only (a run, which must not spend its time
    or memory on them), else ValueError."""
    plan = resolve_plan(cfg, world_size)
    if shape is None:
        from dpo_sweeps.parallel.fit import model_shape_of

        shape = model_shape_of(cfg)
    work = workload_of(cfg, plan, shape)
    layout = layout_of(plan, cfg.resources.nproc_per_node)
    timings = _Timings(cfg, plan, profile, time_passes)
    worst = predict_step(work, layout, profile, passes=timings.at(work.positions, ()))
    reason = None
    if lengths is None and read_data:
        from dpo_sweeps.cost.data_lengths import data_lengths
        from dpo_sweeps.errors import DataError, InvalidConfig

        try:
            lengths = data_lengths(cfg, plan.world_size)
        except (DataError, InvalidConfig, OSError, ValueError) as exc:
            reason = f"the data's lengths could not be read ({str(exc).splitlines()[0] if str(exc) else exc})"
    elif lengths is None:
        reason = "the data was not read"
    prediction = worst
    if lengths is not None:
        prediction = _expected(cfg, work, layout, profile, lengths, timings, worst)
    steps = cfg.probe.steps or cfg.train.max_steps
    hours = steps * plan.world_size / 3600
    return replace(prediction, device_hours=prediction.step_time_s.scaled(hours), peak_memory_gib=peak_memory_gib,
                   worst_step_time_s=worst.step_time_s, worst_device_hours=worst.step_time_s.scaled(hours),
                   lengths_from=lengths.describe() if lengths is not None else None, lengths_reason=reason,
                   padding_fraction=lengths.padding_fraction() if lengths is not None else None,
                   compiled_as_eager=cfg.train.compile, provisional=timings.provisional(),
                   timed_shapes=tuple(timings.used))


class _Timings:
    """A measured profile's pass timings of one config (cpu_passes.py): at its longest pairs, and at a few of
    the micro-batches its data makes, interpolated in between by their padded positions (the blocks' work
    grows with them; a micro-batch's fixed costs are the same at every length). None on a datasheet profile."""

    def __init__(self, cfg, plan, profile: DeviceProfile, time_passes: bool):
        self.profile, self.time_passes = profile, time_passes
        self.key = None
        if profile.measured:
            from dpo_sweeps.cost.cpu_passes import pass_shape

            self.key = pass_shape(cfg, plan, rank_threads(cfg))
        self.points: dict[int, MeasuredPasses] = {}
        self.used: list = []
        self._provisional = False

    def at(self, positions: int, pairs: tuple, row_tokens: int | None = None) -> MeasuredPasses | None:
        """Time (or read) the passes of the micro-batch of these pairs (() : the longest) and keep them as the
        point at `positions`. `row_tokens`: a packed micro-batch's budget for these pairs (data_lengths.py);
        None: the config's."""
        if self.key is None:
            return None
        from dpo_sweeps.cost.cpu_passes import cached_timing, timed_passes

        key = replace(self.key, lengths=pairs, pairs=len(pairs) or self.key.pairs,
                      row_tokens=row_tokens if row_tokens is not None else self.key.row_tokens)
        timing = timed_passes(key) if self.time_passes else cached_timing(key)
        if timing is None:
            raise ValueError("cluster=cpu: this point's passes were not timed before it ran (a sweep or dry run "
                             "with cluster=cpu times them)")
        self.used.append(key)
        self._provisional |= timing.provisional
        self.points[positions] = timing.passes
        return timing.passes

    def provisional(self) -> bool:
        return self._provisional or self.profile.provisional

    def _monotone(self) -> dict[int, dict[str, float]]:
        """The timed points, each capped by those of larger micro-batches: fewer padded positions never take
        longer; a point above a larger one waited for cores another process held (cost/load.py)."""
        out, cap = {}, float("inf")
        for x in sorted(self.points, reverse=True):
            own = asdict(self.points[x])
            total = own["block_train_s"] + own["rest_train_s"]
            scale = min(1.0, cap / total) if total > 0 else 1.0  # the whole point: its split is a difference
            out[x] = {k: v * scale for k, v in own.items()}
            cap = min(cap, total * scale)
        return out

    def interpolated(self, positions: int) -> MeasuredPasses | None:
        if self.key is None:
            return None
        xs = sorted(self.points)
        if positions in self.points or len(xs) == 1:
            return MeasuredPasses(**self._monotone()[positions if positions in self.points else xs[0]])
        # The segment that holds `positions`, or the nearest one (extrapolated, never below proportional).
        i = max(1, min(len(xs) - 1, next((k for k, x in enumerate(xs) if x >= positions), len(xs) - 1)))
        x0, x1 = xs[i - 1], xs[i]
        t = (positions - x0) / (x1 - x0)
        a, b = self._monotone()[x0], self._monotone()[x1]
        return MeasuredPasses(**{k: max(a[k] + t * (b[k] - a[k]), a[k] * min(1.0, positions / x0)) for k in a})


# Quantiles of the data's micro-batches (by padded positions) whose passes a measured profile times.
TIMED_QUANTILES = (0.1, 0.5, 0.9)


def _expected(cfg, work: Workload, layout: Layout, profile: DeviceProfile, lengths, timings: _Timings,
              worst: Prediction) -> Prediction:
    """The mean step of the simulated steps: each micro-batch as long as its longest row (packed: its rows as
    collate_packed builds them, attention over each whole row under the dense mask), gated by the slowest rank
    (FSDP's collectives wait for it), then the optimizer once."""
    micro_batches = lengths.micro_batches()
    if timings.key is not None:
        ordered = sorted(micro_batches, key=lambda mb: mb.positions)
        for q in TIMED_QUANTILES:
            mb = ordered[min(len(ordered) - 1, int(q * len(ordered)))]
            if mb.positions not in timings.points:
                timings.at(mb.positions, mb.pairs, mb.row_tokens)
    chunked = cfg.train.logps_chunk_size > 0
    memo: dict[tuple, tuple[Prediction, Workload]] = {}

    def one(mb) -> tuple[Prediction, Workload]:
        key = (mb.rows, mb.width, mb.response_tokens)
        if key not in memo:
            mb_work = replace(work, positions=mb.positions, scored=mb.response_tokens if chunked else mb.positions,
                              attention=mb.rows * mb.width**2, micro_batches=1)
            memo[key] = (predict_step(mb_work, layout, profile, passes=timings.interpolated(mb.positions)), mb_work)
        return memo[key]

    values, lows, highs, tokens, flops = [], [], [], [], []
    for step in lengths.steps:
        v = lo = hi = 0.0
        for ranks in step:
            p, mb_work = max((one(mb) for mb in ranks), key=lambda pw: pw[0].step_time_s.value)
            micro = p.step_time_s.value - p.optimizer_s
            v, lo = v + micro, lo + micro * p.step_time_s.low / p.step_time_s.value
            hi += micro * p.step_time_s.high / p.step_time_s.value
            tokens.append(sum(mb.positions for mb in ranks) / len(ranks))
            flops.append(sum(one(mb)[1].model_flops() for mb in ranks) / len(ranks))
        values.append(v)
        lows.append(lo)
        highs.append(hi)
    n = len(lengths.steps)
    w = worst.step_time_s
    opt = worst.optimizer_s
    step = Estimate(sum(values) / n + opt, sum(lows) / n + opt * w.low / w.value, sum(highs) / n + opt * w.high / w.value)
    mfu = step.inverse(sum(flops) / n / profile.peak(layout.compute)) if worst.mfu is not None else None
    return replace(worst, step_time_s=step, tokens_per_s_per_device=step.inverse(sum(tokens) / n), mfu=mfu)


COMPILED_AS_EAGER = "eager: train.compile's compiled blocks are priced as uncompiled ones"


def predicted_step_metrics(cfg, world_size: int, device, shape, measured_step_s: float | None = None) -> dict:
    """summary.json's perf/step_time_predicted_s (and its interval, _low_s and _high_s) of a run: on its
    cluster=, else on the profile of the GPU it runs on, else on this machine's cached CPU profile (none
    until a sweep with cluster=cpu measured it: perf/step_time_predicted_reason says so); expected from the
    run's own pairs (perf/step_time_predicted_lengths names them, or says why not), with the worst case
    beside it (perf/step_time_predicted_worst_s) and the share of the forecast micro-batches' positions that
    are padding (perf/padding_fraction_predicted, beside the run's own perf/padding_fraction); a compiled run
    says it was priced as eager (perf/step_time_predicted_basis). `device`: the run's torch.device; `shape`: its model's
    ModelShape. A `measured_step_s` outside the interval marks the cached timings the prediction used for
    re-timing, and the run's log says so (perf/step_time_predicted_retimed)."""
    try:
        device_name = None
        if device.type == "cuda":
            import torch

            device_name = torch.cuda.get_device_name(device)
        profile = _run_profile(cfg, device_name)
        if profile is None:
            return {"perf/step_time_predicted_s": None, "perf/step_time_predicted_reason":
                    "no profile: name a cluster= (cluster=cpu measures this machine once)"}
        prediction = predict_config(cfg, profile, world_size, shape=shape, time_passes=False)
    except (OSError, ValueError, KeyError) as exc:
        return {"perf/step_time_predicted_s": None, "perf/step_time_predicted_reason": str(exc).splitlines()[0]}
    step, worst = prediction.step_time_s, prediction.worst_step_time_s
    metrics = {"perf/step_time_predicted_s": step.value, "perf/step_time_predicted_low_s": step.low,
               "perf/step_time_predicted_high_s": step.high, "perf/step_time_predicted_profile": profile.name,
               "perf/step_time_predicted_worst_s": worst.value if worst is not None else None,
               "perf/step_time_predicted_lengths": prediction.lengths_from or prediction.lengths_reason,
               "perf/step_time_predicted_provisional": prediction.provisional,
               "perf/padding_fraction_predicted": prediction.padding_fraction}
    if prediction.compiled_as_eager:
        metrics["perf/step_time_predicted_basis"] = COMPILED_AS_EAGER
    if measured_step_s is not None and profile.measured and not step.low <= measured_step_s <= step.high:
        metrics["perf/step_time_predicted_retimed"] = _mark_for_retiming(cfg, prediction, measured_step_s)
    return metrics


def _mark_for_retiming(cfg, prediction: Prediction, measured_s: float) -> int:
    """A run's step outside its predicted interval: the timings behind the prediction are doubted, so the next
    forecast takes them again (at a quiet chance, cost/load.py). Rank 0 marks them and says so."""
    import logging

    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return 0
    from dpo_sweeps.cost.cpu_passes import mark_for_retiming
    from dpo_sweeps.cost.cpu_profile import mark_for_remeasuring

    marked = mark_for_retiming(prediction.timed_shapes) + int(mark_for_remeasuring(rank_threads(cfg)))
    step = prediction.step_time_s
    logging.getLogger("dpo_sweeps").warning(
        "measured step %.3g s is outside the predicted %.3g s [%.3g-%.3g] (cluster=cpu): %d cached timings it "
        "used are marked for re-timing at the next forecast", measured_s, step.value, step.low, step.high, marked)
    return marked


def _run_profile(cfg, device_name: str | None) -> DeviceProfile | None:
    if cfg.cluster is not None and not cfg.cluster.measured:
        return device_profile(cfg.cluster)
    if device_name is not None:  # a GPU
        name = profile_name_of_device(device_name)
        return device_profile(builtin_cluster(name)) if name else None
    return this_cpu_profile(cfg)


def this_cpu_profile(cfg) -> DeviceProfile | None:
    """cluster=cpu's profile of this machine on a rank's threads, as cached (None: not measured yet); never
    measures (a run, and the forecast of runs, must not spend their time on it)."""
    from dpo_sweeps.cost.cpu_profile import cached_measurement, profile_of

    found = cached_measurement(rank_threads(cfg))
    return profile_of(builtin_cluster("cpu"), found) if found is not None else None


def total_text(predictions: list[Prediction]) -> str:
    """The sweep's total device-hours, with its interval (the points' intervals summed: a worst case), from
    the steps expected of the data's lengths, and the worst case (every row at data.max_length) beside it."""
    total = Estimate(sum(p.device_hours.value for p in predictions), sum(p.device_hours.low for p in predictions),
                     sum(p.device_hours.high for p in predictions))
    worst = sum((p.worst_device_hours or p.device_hours).value for p in predictions)
    at_worst = [p for p in predictions if not p.expected]
    how = "expected from the data's lengths" if not at_worst else (
        f"{len(at_worst)} of them at their worst case ({at_worst[0].lengths_reason})")
    line = (f"predicted total: {total.value:.3g} device-hours [{total.low:.3g}-{total.high:.3g}] "
            f"for {len(predictions)} runs, {how}; worst case (every row at data.max_length): {worst:.3g} device-hours")
    provisional = sum(p.provisional for p in predictions)
    if provisional:
        line += (f"; {provisional} rest on a provisional timing (taken on a busy machine, re-taken at the next "
                 "quiet chance)")
    return line
