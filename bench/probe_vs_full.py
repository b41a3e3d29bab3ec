"""Does probing a sweep rank its configs by speed per memory as training them fully does?

    python bench/probe_vs_full.py                       # 3 probe sweeps (4 probes, one per shape) alternating
                                                        # with 3 full sweeps of 8 runs
    python bench/probe_vs_full.py --probe-every-point   # 8 probes, one per grid point
    python bench/probe_vs_full.py --full-repeats 1 --probe-steps 10 --probe-warmup 1 --workdir /tmp/pvf

The quickstart grid is fsdp {full_shard, shard_grad_op} x precision {fp32, bf16} x beta {0.1, 0.5},
2 ranks each. Beta changes neither what is computed nor what is held in memory, so by default the probe
sweep covers the four shapes that can differ (`+sweep=quickstart probe.steps=N loss.beta=0.1`) and each
grid point takes the probe of its shape: the beta=0.1 and beta=0.5 points tie in the probe's ranking.
Each full sweep trains all 8 points for 60 steps. Probe and full sweeps alternate (probe, full, probe,
full, ...), so a slow spell of the machine falls on both kinds; a probe's figures are the medians of
its probe sweeps.

Rankings are compared with Spearman's rho (ties at their average rank) on `perf/speed_per_memory` of
summary.json (tokens over the summed step times, per GiB: what analysis/report.py ranks by) and on the
same from the median step time (metrics.jsonl). Full sweeps are repeated because on a small shared
machine two full sweeps do not rank configs that are within a few percent of each other the same way:
the script prints the probe against each full sweep, the full sweeps against each other, the probe
against the mean of the full sweeps and each full sweep against the mean of the others. Then, pair by
pair of shapes, whether the full runs tell the two apart at all (rank-sum test over every full run of
each) and whether the probe orders them as the full runs do. First of all it runs bench/steadiness.py
for a minute: how much the machine's own speed drifts, which bounds what any single run can rank.
Then, shape by shape, whether its probe's speed per memory lies within the spread (lowest to highest)
of that shape's full runs. Cost, against one full sweep: training steps (the same batches, so steps
are compute), the measured step time plus the reference pass, the CPU seconds of every process
(start-up, data, evaluation included) and the wall time. The probe sweep runs its probes in turn in
one set of rank processes (dpo_sweeps/runtime/shared_ranks.py); `--probes-per-job 1` gives every
probe processes of its own, as before that existed. Each config's measured peak memory is printed beside
memory_estimate.py's estimate.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is a folder of scripts, not a package
import steadiness  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
KEYS = ("fsdp", "precision", "loss.beta")
STEADINESS_WINDOW_S = 5.0  # about the training time of one quickstart run


def sweep(sweep_dir: Path, extra: list[str], log: Path) -> dict:
    """One multirun; its wall time and the CPU seconds of all its processes."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "dpo_sweeps", "-m", "+sweep=quickstart", f"hydra.sweep.dir={sweep_dir}",
           "hydra.launcher.max_concurrent_jobs=1", "tracking.wandb.mode=disabled", "train.progress_bar=false", *extra]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    with log.open("w") as f:
        code = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"returncode": code, "wall_s": time.perf_counter() - start, "cpu_s": cpu}


def read_runs(sweep_dir: Path) -> dict[tuple, dict]:
    runs = {}
    for summary_path in sorted(sweep_dir.glob("*/summary.json")):
        summary = json.loads(summary_path.read_text())
        overrides = dict(o.split("=", 1) for o in summary["overrides"] if "=" in o)
        key = tuple(overrides.get(k) for k in KEYS)
        metrics = summary["metrics"]
        records = [json.loads(line) for line in (summary_path.parent / "metrics.jsonl").open()]
        steps = [r["perf/step_time_s"] for r in records if "train/loss" in r]
        warmup = summary["config"]["perf"]["warmup_steps"]
        median_step = statistics.median(steps[warmup:] or steps)
        runs[key] = {"status": summary["status"], "speed_per_memory": metrics.get("perf/speed_per_memory"),
                     "median_speed_per_memory": 1 / median_step / metrics["perf/peak_memory_gib"],
                     "reference_s": metrics.get("perf/reference_precompute_s") or 0.0,
                     "tokens_per_s_per_device": metrics.get("perf/tokens_per_s_per_device"),
                     "peak_memory_gib": metrics.get("perf/peak_memory_gib"),
                     "estimate_gib": metrics.get("perf/peak_memory_estimate_gib"), "steps": metrics.get("steps"),
                     "step_s": sum(steps)}
    return runs


def median_runs(sweeps: list[dict[tuple, dict]]) -> dict[tuple, dict]:
    """Per config, the median of each figure over repeated sweeps (completed only if completed in all)."""
    merged = {}
    for c in sweeps[0]:
        runs = [s[c] for s in sweeps if c in s]
        numbers = {k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        merged[c] = {**runs[0], **{k: statistics.median(r[k] for r in runs) for k in numbers
                                   if all(isinstance(r.get(k), (int, float)) for r in runs)}}
        merged[c]["status"] = "completed" if all(r["status"] == "completed" for r in runs) else "failed"
    return merged


def average_ranks(values: list[float]) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in set(values):  # ties share their average rank
        tied = [i for i, x in enumerate(values) if x == v]
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = average_ranks(a), average_ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def shape_probes(probed: dict[tuple, dict], grid: list[tuple]) -> dict[tuple, dict]:
    """Each grid point's probe: its own, or the probe of its shape (fsdp, precision), which beta cannot change."""
    by_shape = {c[:2]: r for c, r in probed.items()}
    return {c: probed.get(c) or by_shape[c[:2]] for c in grid if c in probed or c[:2] in by_shape}


def rho_of(a: dict[tuple, dict], b: dict[tuple, dict], configs: list[tuple], key: str = "speed_per_memory") -> float:
    return spearman([a[c][key] for c in configs], [b[c][key] for c in configs])


def pooled(fulls: list[dict[tuple, dict]], configs: list[tuple]) -> dict[tuple, dict]:
    """Per config, the mean of the full sweeps' figures: a steadier reference than any one sweep."""
    return {c: {k: statistics.mean(f[c][k] for f in fulls) for k in ("speed_per_memory", "median_speed_per_memory")}
            for c in configs}


def rank_sum_p(a: list[float], b: list[float], limit: int = 20000) -> float:
    """Two-sided p of the rank-sum (Mann-Whitney) test that a and b come from one distribution: exact over
    every split of the pooled samples, or over `limit` seeded random splits when there are more."""
    pooled_ranks = average_ranks(list(a) + list(b))
    n, total = len(a), len(a) + len(b)
    observed = pooled_ranks[:n].sum()
    centre = n * (total + 1) / 2
    if math.comb(total, n) <= limit:
        splits = itertools.combinations(range(total), n)
    else:
        rng = np.random.default_rng(0)
        splits = (rng.choice(total, n, replace=False) for _ in range(limit))
    sums = np.array([pooled_ranks[list(s)].sum() for s in splits])
    return float(np.mean(np.abs(sums - centre) >= abs(observed - centre) - 1e-9))


def separated_pairs(probe: dict[tuple, dict], fulls: list[dict[tuple, dict]], configs: list[tuple],
                    alpha: float = 0.05) -> list[dict]:
    """Each pair of shapes (fsdp, precision) with every full run of each: do the full runs tell them apart
    (rank-sum p < alpha), and does the probe order them as the full runs' mean does?"""
    samples: dict[tuple, list[float]] = {}
    for f in fulls:
        for c in configs:
            samples.setdefault(c[:2], []).append(f[c]["speed_per_memory"])
    probe_of = {c[:2]: probe[c]["speed_per_memory"] for c in configs}
    pairs = []
    for a, b in itertools.combinations(sorted(samples), 2):
        p = rank_sum_p(samples[a], samples[b])
        full_diff = statistics.mean(samples[a]) / statistics.mean(samples[b]) - 1
        pairs.append({"a": a, "b": b, "p": p, "separated": p < alpha, "full_diff": full_diff,
                      "probe_agrees": (probe_of[a] > probe_of[b]) == (full_diff > 0)})
    return pairs


def fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.3f}" for v in values) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/probe-vs-full"))
    parser.add_argument("--probe-steps", type=int, default=None,
                        help="steps per probe (default 10 per shape, 5 with --probe-every-point: under 10%% of "
                             "one full sweep's 480 steps either way)")
    parser.add_argument("--probe-warmup", type=int, default=1, help="perf.warmup_steps of the probes")
    parser.add_argument("--probe-every-point", action="store_true",
                        help="probe all 8 grid points instead of the 4 shapes beta does not change")
    parser.add_argument("--probe-repeats", type=int, default=3,
                        help="probe sweeps to run, each before a full sweep: the probe figures are their medians")
    parser.add_argument("--full-repeats", type=int, default=3,
                        help="full sweeps to run: the probe is compared with each, and the sweeps with each other")
    parser.add_argument("--probes-per-job", type=int, default=None,
                        help="hydra.launcher.probes_per_job of the probe sweep (default: all 4 in one set of "
                             "rank processes; 1: each probe in processes of its own)")
    parser.add_argument("--reuse", action="store_true", help="only compare the runs already in --workdir")
    parser.add_argument("--steadiness-s", type=float, default=60.0,
                        help="seconds of bench/steadiness.py first, to show how much this machine's speed drifts "
                             "(0: skip)")
    args = parser.parse_args()
    if args.probe_steps is None:
        args.probe_steps = 5 if args.probe_every_point else 10
    args.workdir.mkdir(parents=True, exist_ok=True)
    full_dirs = [args.workdir / (f"full-{i + 1}" if i else "full") for i in range(args.full_repeats)]
    probe_dirs = [args.workdir / (f"probe-{i + 1}" if i else "probe") for i in range(args.probe_repeats)]

    if args.reuse:
        saved = json.loads((args.workdir / "results.json").read_text())
        cost, machine = saved["cost"], saved.get("steadiness")
    else:
        machine = None
        if args.steadiness_s > 0:  # before the sweeps, on the same quiet machine
            machine = {str(k): v for k, v in steadiness.measure(args.steadiness_s, STEADINESS_WINDOW_S).items()}
            print(f"This machine, same matrix products over {args.steadiness_s:g} s (bench/steadiness.py):")
            print(steadiness.describe(machine, STEADINESS_WINDOW_S))
        shapes_only = [] if args.probe_every_point else ["loss.beta=0.1"]
        batching = [] if args.probes_per_job is None else [f"hydra.launcher.probes_per_job={args.probes_per_job}"]
        probing = [f"probe.steps={args.probe_steps}", f"perf.warmup_steps={args.probe_warmup}", *shapes_only,
                   *batching]
        cost = {}
        # Alternating (probe sweep, full sweep, ...): a slow spell of the machine hits both kinds alike.
        for i in range(max(len(probe_dirs), len(full_dirs))):
            for d, extra in ((probe_dirs[i] if i < len(probe_dirs) else None, probing),
                             (full_dirs[i] if i < len(full_dirs) else None, [])):
                if d is not None:
                    cost[d.name] = sweep(d, extra, args.workdir / f"{d.name}.log")
    probe_sweeps = [read_runs(d) for d in probe_dirs]
    probed = median_runs(probe_sweeps)
    fulls = [read_runs(d) for d in full_dirs]
    full = fulls[0]
    probe = shape_probes(probed, sorted(full))
    ok = [c for c in sorted(probe) if probe[c]["status"] == "completed"
          and all(f.get(c, {}).get("status") == "completed" for f in fulls)]
    reference = pooled(fulls, ok)

    print(f"{'fsdp':<14}{'precision':<10}{'beta':<6}{'probe tok/s/GiB':>16}{'full tok/s/GiB (each sweep)':>30}"
          f"{'probe rank':>11}{'full rank':>10}{'peak GiB':>10}{'estimate':>10}{'error':>8}")
    pr = average_ranks([-probe[c]["speed_per_memory"] for c in ok])
    fr = average_ranks([-reference[c]["speed_per_memory"] for c in ok])
    for i, c in enumerate(ok):
        f = full[c]
        err = (f["estimate_gib"] - f["peak_memory_gib"]) / f["peak_memory_gib"] if f["estimate_gib"] else float("nan")
        each = " ".join(f"{g[c]['speed_per_memory']:.0f}" for g in fulls)
        print(f"{c[0]:<14}{c[1]:<10}{c[2]:<6}{probe[c]['speed_per_memory']:>16.0f}{each:>30}"
              f"{pr[i]:>11.1f}{fr[i]:>10.1f}{f['peak_memory_gib']:>10.3f}{f['estimate_gib'] or 0:>10.3f}{err:>+8.0%}")
    print("(full rank: by the mean of the full sweeps)")

    results: dict = {"probe_vs_full": [], "full_vs_full": []}
    for key, label in (("speed_per_memory", "perf/speed_per_memory"), ("median_speed_per_memory", "median step")):
        vs_each = [rho_of(probe, f, ok, key) for f in fulls]
        pairs = [rho_of(fulls[i], fulls[j], ok, key) for i in range(len(fulls)) for j in range(i + 1, len(fulls))]
        vs_pooled = rho_of(probe, reference, ok, key)
        loo = [rho_of(f, pooled([g for g in fulls if g is not f], ok), ok, key) for f in fulls if len(fulls) > 2]
        results[key] = {"probe_vs_each_full": vs_each, "full_vs_full": pairs, "probe_vs_pooled": vs_pooled,
                        "full_vs_pooled_others": loo}
        print(f"\nSpearman rho over {len(ok)} grid points, on {label}:")
        print(f"  probe vs each full sweep:               {fmt(vs_each)}")
        print(f"  full sweep vs full sweep:               {fmt(pairs)}")
        print(f"  probe vs the mean of the full sweeps:   {vs_pooled:.3f}")
        print(f"  each full sweep vs the mean of the rest: {fmt(loo)}")

    pairs = separated_pairs(probe, fulls, ok)
    apart = [q for q in pairs if q["separated"]]
    print(f"\nPairs of shapes, every full run of each ({2 * len(fulls)} a shape), rank-sum test at p < 0.05:")
    for q in pairs:
        print(f"  {'/'.join(q['a']):<20} vs {'/'.join(q['b']):<20} full runs' means differ {q['full_diff']:+6.1%}, "
              f"p {q['p']:.3f} ({'apart' if q['separated'] else 'not told apart'}); probe "
              f"{'orders them the same' if q['probe_agrees'] else 'orders them the other way'}")
    print(f"  the full runs tell {len(apart)} of {len(pairs)} pairs apart; the probe orders "
          f"{sum(q['probe_agrees'] for q in apart)} of those {len(apart)} the same way")
    results["pairs"] = [{**q, "a": "/".join(q["a"]), "b": "/".join(q["b"])} for q in pairs]

    # Does each shape's probe land within the spread of that shape's full runs?
    print(f"\nEach shape's probe against the spread (lowest to highest) of its {2 * len(fulls)} full runs, tok/s/GiB:")
    spreads = {}
    for shape in sorted({c[:2] for c in ok}):
        runs_of = [f[c]["speed_per_memory"] for f in fulls for c in ok if c[:2] == shape]
        value = probe[next(c for c in ok if c[:2] == shape)]["speed_per_memory"]
        spreads["/".join(shape)] = {"probe": value, "full_min": min(runs_of), "full_max": max(runs_of),
                                    "within": min(runs_of) <= value <= max(runs_of)}
        print(f"  {'/'.join(shape):<22} probe {value:>8.0f}   full {min(runs_of):>8.0f} .. {max(runs_of):<8.0f} "
              f"{'within' if spreads['/'.join(shape)]['within'] else 'OUTSIDE'}")
    print(f"  {sum(s['within'] for s in spreads.values())} of {len(spreads)} probes (median of {len(probe_sweeps)} "
          "probe sweeps) within their shape's spread")
    for d, one in zip(probe_dirs, probe_sweeps):
        inside = sum(min(f[c]["speed_per_memory"] for f in fulls for c in ok if c[:2] == c0[:2])
                     <= one[c0]["speed_per_memory"]
                     <= max(f[c]["speed_per_memory"] for f in fulls for c in ok if c[:2] == c0[:2])
                     for c0 in one if c0 in probe and one[c0]["status"] == "completed")
        print(f"  {d.name} alone: {inside} of {len(one)} within (wall {cost[d.name]['wall_s']:.1f} s)")
    results["within_spread"] = spreads

    runs = {"probe": probed, "full": full}
    train_s = {name: sum(r["step_s"] + r["reference_s"] for r in rs.values() if r["status"] == "completed")
               for name, rs in runs.items()}
    steps = {name: sum(r["steps"] or 0 for r in rs.values()) for name, rs in runs.items()}
    step_ratio = train_s["probe"] / max(1e-9, train_s["full"])
    steps_ratio = steps["probe"] / max(1, steps["full"])
    med = {kind: {k: statistics.median(cost[d.name][k] for d in dirs) for k in ("cpu_s", "wall_s")}
           for kind, dirs in (("probe", probe_dirs), ("full", full_dirs))}
    walls = {kind: ", ".join(f"{cost[d.name]['wall_s']:.1f}" for d in dirs)
             for kind, dirs in (("probe", probe_dirs), ("full", full_dirs))}
    print(f"\nprobe cost / one full sweep's: training steps {steps['probe']}/{steps['full']} = {steps_ratio:.1%}, "
          f"measured step time and reference pass {step_ratio:.1%}, "
          f"CPU seconds of all processes {med['probe']['cpu_s'] / med['full']['cpu_s']:.1%}, "
          f"wall {med['probe']['wall_s'] / med['full']['wall_s']:.1%} (process start-up included; medians of: "
          f"probe sweeps {walls['probe']} s, full sweeps {walls['full']} s)")
    results["wall_ratio"] = med["probe"]["wall_s"] / med["full"]["wall_s"]
    print(f"(probe: {len(probed)} runs of {args.probe_steps} steps, {args.probe_warmup} untimed; full: "
          f"{len(fulls)} sweeps of {max(full[c]['steps'] or 0 for c in ok)} steps a run; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    (args.workdir / "results.json").write_text(json.dumps({
        **results, "cost": cost, "steadiness": machine, "step_ratio": step_ratio, "steps": steps,
        "steps_ratio": steps_ratio, "probe_steps": args.probe_steps, "probe_warmup": args.probe_warmup,
        "probe_every_point": args.probe_every_point, "probe": {"/".join(c): probe[c] for c in ok},
        "full": [{"/".join(c): f[c] for c in ok} for f in fulls],
    }, indent=1))


if __name__ == "__main__":
    main()
