"""What a sweep costs before launch as it grows: dry-run wall time and peak memory for N points.

    python bench/sweep_scale.py                       # 100, 1,000, 10,000 points, 3 repeats each
    python bench/sweep_scale.py --sizes 100 1000 --repeats 1 --code /tmp/before   # another checkout's code
    python bench/sweep_scale.py --resume 1000 --source multirun/one_run           # rerun of N completed runs

Each measurement is one `python -m dpo_sweeps -m 'train.seed=range(0,N)' hydra.sweeper.dry_run=true`
process with the fit check on (`resources.device_memory_gib`): composing every point, the pre-launch
checks (launchers/preflight.py, dpo_sweeps/config/validate.py), the fit check and the listing. The
sizes alternate within each repeat (100, 1,000, 10,000, 100, ...), and the table gives each size's
median wall time and the sweep process's peak resident memory (its own, from wait4: the estimator
process it starts is not counted). `--resume N` instead writes N completed runs of one real run
(bench/make_runs.py) and times the sweep that skips them all.
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
QUIET = ["wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false"]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--code", type=Path, default=REPO, help="the checkout whose code runs (default: this one)")
    parser.add_argument("--device-memory-gib", type=float, default=80.0)
    parser.add_argument("--resume", type=int, default=None, metavar="N")
    parser.add_argument("--source", type=Path, default=None, help="with --resume: one completed run's directory")
    args = parser.parse_args()
    if args.resume:
        resume_curve(args.resume, args.source, args.repeats)
    else:
        dry_run_curve(args.sizes, args.repeats, args.code.resolve(), args.device_memory_gib)


if __name__ == "__main__":
    main()
