"""What a short run costs to start: this checkout against another, run after run, alternating.

Most runs a sweep's probes, the fit check and the tests start are short: a few steps of a small model,
so the seconds each process spends importing torch, transformers and torch.distributed (and tearing
them down at exit) are most of what they cost. Each workload runs as the user types it, in a process
of its own; wall time, and CPU seconds from getrusage(RUSAGE_CHILDREN), which counts every process
the command started and waited for (the ranks, a sweep's jobs).

    python bench/startup.py --tree /path/to/other/checkout --repeat 5

Workloads: a 1-rank run of 3 steps; a 2-rank run of 3 steps (the launcher spawns the ranks); a local
sweep of two 1-rank jobs of 2 steps (submitit starts a task process per job). Both trees use this
venv's Python (`sys.executable`) with PYTHONPATH set to the tree. Medians, min-max in brackets.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SHORT = ["train.eval_every=0", "tracking.wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false",
         "data.num_train_pairs=64", "data.num_eval_pairs=16", "train.batch_size=8",
         "train.micro_batch_size=4"]
WORKLOADS = {
    "run-1rank": ["-m", "dpo_sweeps", *SHORT, "train.max_steps=3", "hydra.run.dir={out}"],
    "run-2rank": ["-m", "dpo_sweeps", *SHORT, "train.max_steps=3", "resources.nproc_per_node=2",
                  "hydra.run.dir={out}"],
    "sweep-2jobs": ["-m", "dpo_sweeps", "-m", *SHORT, "train.max_steps=2", "train.seed=0,1",
                    "hydra.launcher.max_concurrent_jobs=2", "hydra.sweep.dir={out}"],
}


def measure(tree: Path, args: list[str], scratch: Path) -> tuple[float, float]:
    out = scratch / "out"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *(a.format(out=out) for a in args)], cwd=scratch, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{tree}: {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, required=True, help="the other checkout (the 'before')")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workloads")
    args = parser.parse_args()
    trees = {"before": args.tree.resolve(), "after": HERE}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for name in args.only.split(","):
            for _ in range(args.repeat):
                for label, tree in trees.items():  # alternating: drift hits both alike
                    results.setdefault((name, label), []).append(measure(tree, WORKLOADS[name], scratch))
            print(f"{name}: done", file=sys.stderr, flush=True)
    print("| workload | before wall s | after wall s | before CPU s | after CPU s |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.only.split(","):
        b, a = results[(name, "before")], results[(name, "after")]
        print(f"| {name} | {spread([w for w, _ in b])} | {spread([w for w, _ in a])} | "
              f"{spread([c for _, c in b])} | {spread([c for _, c in a])} |")


if __name__ == "__main__":
    main()
