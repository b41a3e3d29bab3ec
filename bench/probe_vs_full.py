"""Does probing a sweep rank its configs by speed per memory as training them fully does?

    python bench/probe_vs_full.py                      # the quickstart grid: 8 probes, then 8 full runs
    python bench/probe_vs_full.py --probe-steps 6 --workdir /tmp/probe-vs-full

Runs `python -m dpo_sweeps -m +sweep=quickstart probe.steps=N` (fsdp {full_shard, shard_grad_op} x
precision {fp32, bf16} x beta {0.1, 0.5}, 2 ranks each) and the same sweep in full, then compares
the rankings by `perf/speed_per_memory` (Spearman's rho, ties at their average rank), and what each
cost: the training steps' time (from metrics.jsonl, warm-up included), the CPU seconds of every
process (start-up, data, reference pass, evaluation included) and the wall time. It also prints each
config's measured peak memory beside memory_estimate.py's estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
KEYS = ("fsdp", "precision", "loss.beta")


def sweep(sweep_dir: Path, extra: list[str], log: Path) -> dict:
    """One multirun; its wall time and the CPU seconds of all its processes."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "dpo_sweeps", "-m", "+sweep=quickstart", f"hydra.sweep.dir={sweep_dir}",
           "hydra.launcher.max_concurrent_jobs=1", "wandb.mode=disabled", "train.progress_bar=false", *extra]
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
        step_s = sum(r.get("perf/step_time_s", 0.0) for r in records if "train/loss" in r)
        runs[key] = {"status": summary["status"], "speed_per_memory": metrics.get("perf/speed_per_memory"),
                     "tokens_per_s_per_device": metrics.get("perf/tokens_per_s_per_device"),
                     "peak_memory_gib": metrics.get("perf/peak_memory_gib"),
                     "estimate_gib": metrics.get("perf/peak_memory_estimate_gib"), "steps": metrics.get("steps"),
                     "step_s": step_s}
    return runs


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/probe-vs-full"))
    parser.add_argument("--probe-steps", type=int, default=6)
    parser.add_argument("--probe-warmup", type=int, default=2, help="perf.warmup_steps of the probes")
    parser.add_argument("--skip-full", action="store_true", help="reuse the full runs already in --workdir")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)

    cost = {"probe": sweep(args.workdir / "probe", [f"probe.steps={args.probe_steps}",
                                                     f"perf.warmup_steps={args.probe_warmup}"],
                           args.workdir / "probe.log")}
    if not args.skip_full:
        cost["full"] = sweep(args.workdir / "full", [], args.workdir / "full.log")
    probe, full = read_runs(args.workdir / "probe"), read_runs(args.workdir / "full")
    configs = sorted(set(probe) & set(full))
    ok = [c for c in configs if probe[c]["status"] == full[c]["status"] == "completed"]
    rho = spearman([probe[c]["speed_per_memory"] for c in ok], [full[c]["speed_per_memory"] for c in ok])

    print(f"{'fsdp':<14}{'precision':<10}{'beta':<6}{'probe tok/s/GiB':>16}{'full tok/s/GiB':>16}"
          f"{'probe rank':>11}{'full rank':>10}{'peak GiB':>10}{'estimate':>10}{'error':>8}")
    pr = average_ranks([-probe[c]["speed_per_memory"] for c in ok])
    fr = average_ranks([-full[c]["speed_per_memory"] for c in ok])
    for i, c in enumerate(ok):
        f = full[c]
        err = (f["estimate_gib"] - f["peak_memory_gib"]) / f["peak_memory_gib"] if f["estimate_gib"] else float("nan")
        print(f"{c[0]:<14}{c[1]:<10}{c[2]:<6}{probe[c]['speed_per_memory']:>16.1f}{f['speed_per_memory']:>16.1f}"
              f"{pr[i]:>11.1f}{fr[i]:>10.1f}{f['peak_memory_gib']:>10.3f}{f['estimate_gib'] or 0:>10.3f}{err:>+8.0%}")
    step_ratio = sum(probe[c]["step_s"] for c in ok) / max(1e-9, sum(full[c]["step_s"] for c in ok))
    print(f"\nSpearman rho (speed per memory, probe vs full, {len(ok)} configs): {rho:.3f}")
    print(f"probe cost / full cost: training steps {step_ratio:.1%}", end="")
    if "full" in cost:
        print(f", CPU seconds of all processes {cost['probe']['cpu_s'] / cost['full']['cpu_s']:.1%}, "
              f"wall {cost['probe']['wall_s'] / cost['full']['wall_s']:.1%}")
    print(f"(probe: {args.probe_steps} steps, {args.probe_warmup} untimed; full: "
          f"{max(full[c]['steps'] or 0 for c in ok)} steps; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores)")
    (args.workdir / "results.json").write_text(json.dumps({
        "spearman": rho, "cost": cost, "step_ratio": step_ratio, "probe_steps": args.probe_steps,
        "probe": {"/".join(c): probe[c] for c in configs}, "full": {"/".join(c): full[c] for c in configs},
    }, indent=1))


if __name__ == "__main__":
    main()
