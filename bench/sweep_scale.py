"""What a sweep costs before launch as it grows: dry-run wall time and peak memory for N points.

    python bench/sweep_scale.py                       # 100, 1,000, 10,000 points, 3 repeats each
    python bench/sweep_scale.py --sizes 100 1000 --repeats 1 --code /tmp/before   # another checkout's code
    python bench/sweep_scale.py --resume 1000 --source multirun/one_run           # rerun of N completed runs
    python bench/sweep_scale.py --slurm 200          # 200 one-step runs on the SLURM cluster (local_cluster.sh)

Each measurement is one `python -m dpo_sweeps -m 'train.seed=range(0,N)' hydra.sweeper.dry_run=true`
process with the fit check on (`resources.device_memory_gib`): composing every point, the pre-launch
checks (launchers/preflight.py, dpo_sweeps/checks/validate.py), the fit check and the listing. The
sizes alternate within each repeat (100, 1,000, 10,000, 100, ...), and the table gives each size's
median wall time and the sweep process's peak resident memory (its own, from wait4: the estimator
process it starts is not counted). `--resume N` instead writes N completed runs of one real run
(bench/make_runs.py) and times the sweep that skips them all. `--slurm N` runs a sweep of N one-step
runs with `hydra/launcher=slurm` and gives its sbatch calls (job arrays), the sweep process's CPU time
as a share of the sweep's wall time, and how many of the N summaries the report ranks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUIET = ["tracking.wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false"]


def measure(args: list[str], code: Path, cwd: Path) -> tuple[float, float, float, int]:
    """Wall seconds, CPU seconds (user + system), peak RSS (MiB) and exit status of one sweep process
    (its own: the estimator process it starts is not counted)."""
    env = dict(os.environ)
    if code != REPO:  # import that checkout's packages, not this one's editable install
        env["PYTHONPATH"] = f"{code}{os.pathsep}{env.get('PYTHONPATH', '')}"
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dpo_sweeps", "-m", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        print(proc.stderr.read().decode(errors="replace")[-2000:], file=sys.stderr)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode


def dry_run_curve(sizes: list[int], repeats: int, code: Path, memory_gib: float) -> None:
    results: dict[int, list[tuple[float, float, float]]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for n in sizes if r % 2 == 0 else reversed(sizes):
                args = [*QUIET, f"train.seed=range(0,{n})", f"resources.device_memory_gib={memory_gib}",
                        "hydra.sweeper.dry_run=true", f"hydra.sweep.dir={tmp}/sweep{n}"]
                wall, cpu, rss, rc = measure(args, code, code)
                if rc != 0:
                    raise SystemExit(f"the dry run of {n} points failed (exit {rc})")
                results[n].append((wall, cpu, rss))
                print(f"  repeat {r + 1}: {n} points {wall:.1f} s ({cpu:.1f} CPU s), {rss:.0f} MiB", flush=True)
    print(f"\ndry run with the fit check, code from {code} ({repeats} repeats, medians)")
    print("| points | wall s (median) | wall s (all) | CPU s (median) | peak RSS MiB (median) |")
    print("| ---: | ---: | --- | ---: | ---: |")
    for n in sizes:
        walls, cpus, rss = zip(*results[n])
        print(f"| {n:,} | {statistics.median(walls):.1f} | {', '.join(f'{w:.1f}' for w in walls)} "
              f"| {statistics.median(cpus):.1f} | {statistics.median(rss):.0f} |")


def resume_curve(n: int, source: Path, repeats: int) -> None:
    """Rerun a sweep of n points whose runs all completed: every point is skipped."""
    import json

    summary = json.loads((source / "summary.json").read_text()) if (source / "summary.json").exists() else None
    if summary is None:
        raise SystemExit(f"--source {source}: expected one completed run's directory (its summary.json)")
    overrides = [o for o in summary["overrides"] if not o.startswith("train.seed=")]
    with tempfile.TemporaryDirectory() as tmp:
        single = Path(tmp) / "source"
        single.mkdir()
        (single / "0").symlink_to(source.resolve())
        sweep = Path(tmp) / "sweep"
        subprocess.run([sys.executable, str(REPO / "bench" / "make_runs.py"), str(single), str(sweep), str(n)],
                       check=True)
        walls = []
        for r in range(repeats):
            wall, cpu, rss, rc = measure([*overrides, f"train.seed=range(0,{n})", f"hydra.sweep.dir={sweep}"], REPO, REPO)
            if rc != 0:
                raise SystemExit(f"the resumed sweep failed (exit {rc})")
            walls.append(wall)
            print(f"  repeat {r + 1}: {n} completed runs skipped in {wall:.1f} s ({cpu:.1f} CPU s), {rss:.0f} MiB",
                  flush=True)
        started = sum(1 for p in sweep.iterdir() if (p / ".hydra").is_dir())
        print(f"\nresume: {n} completed points, median {statistics.median(walls):.1f} s "
              f"({', '.join(f'{w:.1f}' for w in walls)}); runs started: {started}")


def slurm_sweep(n: int, extra: list[str]) -> None:
    """A sweep of n one-step runs on SLURM: arrays submitted, the sweep's CPU share, the report's rows."""
    import csv

    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "sweep"
        args = [*QUIET, "hydra/launcher=slurm", f"train.seed=range(0,{n})", "train.max_steps=1", "train.eval_every=0",
                "data.num_train_pairs=64", "data.num_eval_pairs=16", "train.batch_size=8", *extra,
                f"hydra.sweep.dir={sweep}"]
        wall, cpu, rss, rc = measure(args, REPO, REPO)
        job_ids = [p.name for p in (sweep / ".submitit").iterdir() if p.is_dir()]
        arrays = {j.split("_")[0] for j in job_ids}
        report = subprocess.run([sys.executable, str(REPO / "analysis" / "report.py"), str(sweep)],
                                capture_output=True, text=True)
        runs_csv = sweep / "report" / "runs.csv"
        rows = list(csv.DictReader(runs_csv.open())) if runs_csv.exists() else []
        completed = sum(r.get("status") == "completed" for r in rows)
    print("| jobs | sbatch calls (arrays) | sweep wall s | sweep CPU s | CPU share | peak RSS MiB | summaries ranked |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {n} | {len(arrays)} | {wall:.0f} | {cpu:.1f} | {100 * cpu / wall:.1f}% | {rss:.0f} | "
          f"{completed} completed of {len(rows)} (report exit {report.returncode}, sweep exit {rc}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout whose code runs (default: this one)")
    parser.add_argument("--device-memory-gib", type=float, default=80.0)
    parser.add_argument("--resume", type=int, default=None, metavar="N")
    parser.add_argument("--source", type=Path, default=None, help="with --resume: one completed run's directory")
    parser.add_argument("--slurm", type=int, default=None, metavar="N")
    parser.add_argument("overrides", nargs="*", help="with --slurm: more overrides (hydra.launcher.partition=...)")
    args = parser.parse_args()
    if args.slurm:
        slurm_sweep(args.slurm, args.overrides)
    elif args.resume:
        resume_curve(args.resume, args.source, args.repeats)
    else:
        dry_run_curve(args.sizes, args.repeats, args.code.resolve(), args.device_memory_gib)


if __name__ == "__main__":
    main()
