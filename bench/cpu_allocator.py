"""glibc's malloc against tcmalloc (`resources.cpu_allocator`): step time, peak memory and the estimate.

    python bench/cpu_allocator.py                 # 4 shapes, 2 rounds, each round alternating the order
    python bench/cpu_allocator.py --rounds 3 --only tiny-llama-bf16-2r

Each shape runs once per allocator per round through `python -m dpo_sweeps` (glibc first in even rounds,
tcmalloc first in odd ones, so that a slow spell of the machine falls on both); from each run's
summary.json: `perf/step_time_s` (the median step after the untimed warm-up), `perf/peak_memory_gib` (the
busiest rank's peak resident set), `perf/peak_memory_estimate_gib` and `layout.cpu_allocator` (the malloc
the ranks ran with). Prints every run, then per shape and allocator the median step time and peak.
Needs tcmalloc (Debian/Ubuntu: libtcmalloc-minimal4). What it measured: bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMON = ["tracking.wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false", "resources.device=cpu",
          "data.num_train_pairs=512", "data.num_eval_pairs=64"]
SMOLLM2 = ["model=smollm2_135m", "resources.nproc_per_node=2", "probe.steps=12", "perf.warmup_steps=2"]
SHAPES = {
    "smol-lora-fs-bf16-mb8-ac": [*SMOLLM2, "peft=lora", "peft.r=16", "fsdp=full_shard", "precision=bf16",
                                 "train.micro_batch_size=8", "fsdp.activation_checkpointing=true"],
    "smol-full-fs-fp32-mb4": [*SMOLLM2, "fsdp=full_shard", "precision=fp32", "train.micro_batch_size=4"],
    "tiny-llama-bf16-2r": ["model=tiny_llama", "precision=bf16", "resources.nproc_per_node=2", "train.max_steps=100",
                           "train.eval_every=0"],
    "bench-gpt2-fp32-2r": ["model=bench_gpt2", "precision=fp32", "resources.nproc_per_node=2", "train.max_steps=40",
                           "train.eval_every=0"],
}
ALLOCATORS = ("glibc", "tcmalloc")


def run(run_dir: Path, overrides: list[str], allocator: str) -> dict:
    args = [sys.executable, "-m", "dpo_sweeps", *COMMON, *overrides, f"resources.cpu_allocator={allocator}",
            f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{run_dir.name} failed:\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", help="comma-separated shape names (default: all)")
    args = parser.parse_args()
    shapes = {k: v for k, v in SHAPES.items() if not args.only or k in args.only.split(",")}
    root = Path(tempfile.mkdtemp(prefix="cpu-allocator-"))
    steps: dict[tuple[str, str], list[float]] = defaultdict(list)
    peaks: dict[tuple[str, str], list[float]] = defaultdict(list)
    for k in range(args.rounds):
        for name, overrides in shapes.items():
            for allocator in ALLOCATORS if k % 2 == 0 else reversed(ALLOCATORS):
                summary = run(root / f"{name}-{allocator}-{k}", overrides, allocator)
                m = summary["metrics"]
                steps[name, allocator].append(m["perf/step_time_s"])
                peaks[name, allocator].append(m["perf/peak_memory_gib"])
                print(f"{name:26} {summary['layout']['cpu_allocator']:9} step {m['perf/step_time_s']:.4f} s  peak "
                      f"{m['perf/peak_memory_gib']:.3f} GiB  estimate {m['perf/peak_memory_estimate_gib']:.3f}",
                      flush=True)
    print(f"\nruns in {root}\n\n{'shape':26} {'glibc step s':>12} {'tcmalloc':>9} {'ratio':>6} "
          f"{'glibc peak GiB':>14} {'tcmalloc':>9}")
    for name in shapes:
        g, t = (statistics.median(steps[name, a]) for a in ALLOCATORS)
        gp, tp = (statistics.median(peaks[name, a]) for a in ALLOCATORS)
        print(f"{name:26} {g:12.4f} {t:9.4f} {t / g:6.2f} {gp:14.3f} {tp:9.3f}")


if __name__ == "__main__":
    main()
