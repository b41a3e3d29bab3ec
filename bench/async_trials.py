"""How long Optuna trial slots sit idle: 8 trials, 2 at a time, of lengths that differ by 3x or more.

    python bench/async_trials.py                    # how long: bench/README.md
    python bench/async_trials.py --reuse DIR        # re-read a finished study's slots.json

Runs a real Optuna sweep (`hydra/sweeper=optuna`, local launcher, 1-rank trials on synthetic data)
whose trials are enqueued with `train.max_steps` alternating between short and long, so trial
lengths differ by 3x or more. The sweeper records when each job ran (`<sweep>/slots.json`).

Idle slot time: until the last trial has started, both slots should be busy; idle time is
slots x (last start - sweep start) minus the time trials ran in that span. (After the last start
nothing is left to give a slot, whichever way trials are scheduled.) The same trial lengths in
batches of 2 that wait for their slowest (hydra-optuna-sweeper's behaviour) would idle
sum over batches of (2 x the longest - the sum of both); that figure is printed beside ours.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpo_sweeps.launchers.trial_slots import SlotRun, idle_slot_seconds  # noqa: E402

SLOTS = 2
QUIET = ["tracking.wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false", "train.eval_every=0",
         "data.num_train_pairs=512", "data.num_eval_pairs=64", "resources.nproc_per_node=1"]


def run_study(sweep_dir: Path, short: int, long: int, trials: int) -> float:
    steps = [long if i % 4 in (0, 3) else short for i in range(trials)]
    enqueue = "[" + ", ".join(f"{{train.max_steps: {s}}}" for s in steps) + "]"
    args = [sys.executable, "-m", "dpo_sweeps", "-m", *QUIET, "hydra/sweeper=optuna",
            f"hydra.sweeper.n_trials={trials}", f"hydra.sweeper.n_jobs={SLOTS}",
            f"train.max_steps=choice({short}, {long})", f"hydra.sweeper.enqueue_trials={enqueue}",
            f"hydra.sweep.dir={sweep_dir}"]
    start = time.time()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the sweep failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.time() - start


def batched_idle(lengths: list[float], slots: int) -> float:
    """Idle slot seconds if trials ran in batches of `slots` that each wait for their slowest."""
    idle = 0.0
    for i in range(0, len(lengths), slots):
        batch = lengths[i:i + slots]
        idle += len(batch) * max(batch) - sum(batch)
    return idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--short-steps", type=int, default=2)
    parser.add_argument("--long-steps", type=int, default=250)
    parser.add_argument("--reuse", type=Path, help="a sweep directory whose slots.json to read instead of running")
    args = parser.parse_args()

    sweep_dir = args.reuse or Path(tempfile.mkdtemp(prefix="async-trials-")) / "study"
    if args.reuse is None:
        wall = run_study(sweep_dir, args.short_steps, args.long_steps, args.trials)
        print(f"sweep: {args.trials} trials, {SLOTS} at a time, {wall:.1f} s (whole process) in {sweep_dir}")
    record = json.loads((sweep_dir / "slots.json").read_text())
    runs = sorted(record["runs"], key=lambda r: r["num"])
    timeline = [SlotRun(job=None, tag=r["trial"], started=r["started"], ended=r["ended"]) for r in runs]
    lengths = [r["ended"] - r["started"] for r in runs]
    span = record["ended"] - record["started"]
    idle = idle_slot_seconds(timeline, record["n_jobs"], record["started"], record["ended"], len(runs))
    print("trial lengths (s): " + ", ".join(f"{x:.1f}" for x in lengths)
          + f"  (longest / shortest: {max(lengths) / min(lengths):.1f}x)")
    print(f"sweeper loop: {span:.1f} s; idle slot time {idle:.2f} s = {100 * idle / span:.1f}% of it")
    print(f"the same lengths in batches of {SLOTS} waiting for their slowest would idle "
          f"{batched_idle(lengths, SLOTS):.1f} s")


if __name__ == "__main__":
    main()
