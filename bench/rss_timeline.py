"""A CPU run's resident memory phase by phase, per rank: what the memory estimate's terms stand for.

    python bench/rss_timeline.py model=smollm2_135m fsdp=full_shard precision=fp32 \
        resources.nproc_per_node=2 train.micro_batch_size=4 probe.steps=3 data.num_train_pairs=512
    python bench/rss_timeline.py --blocks ...      # also at each block's forward and backward
    python bench/rss_timeline.py --show DIR        # print an earlier invocation's timeline again

Runs `python -m dpo_sweeps` with the given overrides (after the bench's quiet defaults) and
bench/rss_timeline_hook/ on PYTHONPATH, whose sitecustomize.py records in every rank, at the end of
each phase of its trainer (data, policy, mesh, reference, sharding, reference pass, optimizer, then
each step's forward, backward and optimizer), the resident set (VmRSS), the phase's peak resident set
(sampled every 5 ms), and the malloc's heap (glibc's mallinfo2, or tcmalloc's MallocExtension: size, in use,
free, mmapped); at the end, the run's
memory estimate term by term. It changes nothing the run computes. What it showed: bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOOK = Path(__file__).resolve().parent / "rss_timeline_hook"
QUIET = ["tracking.wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false", "resources.device=cpu",
         "perf.warmup_steps=1"]
ESTIMATE_TERMS = ("rss_before_model", "model_states", "gathered_params", "reference", "activations", "logits",
                  "baseline", "heap_kept", "total")


def run(out: Path, overrides: list[str], blocks: bool) -> int:
    env = {**os.environ, "RSS_TIMELINE_DIR": str(out / "timeline"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")]))}
    if blocks:
        env["RSS_TIMELINE_BLOCKS"] = "1"
    (out / "timeline").mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "dpo_sweeps", *QUIET, *overrides, f"hydra.run.dir={out / 'run'}"]
    with open(out / "output.txt", "w") as log:
        return subprocess.run(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def show(out: Path) -> None:
    for path in sorted((out / "timeline").glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        print(f"rank {path.name.split('-')[0]} (MiB; 'peak' is the phase's, the rest at its end)")
        print(f"  {'phase':28} {'peak':>7} {'rss':>7} {'heap':>7} {'in use':>7} {'free':>7} {'mmapped':>7}")
        for row in rows:
            if row["kind"] == "estimate":
                print("  estimate: " + ", ".join(f"{k} {row[k]:.0f}" for k in ESTIMATE_TERMS))
                continue
            if row["kind"] == "end":
                where = row["phase"]
            elif row["kind"] == "reference_batch":
                where = f"  {row['pairs']} pairs, {row['longest']} tokens"
            else:
                where = f"  {row['kind']} {row['block']}"
            print(f"  {where[:28]:28} {row['phase_peak']:7.0f} {row['VmRSS']:7.0f} {row.get('heap', 0):7.0f} "
                  f"{row.get('in_use', 0):7.0f} {row.get('free', 0):7.0f} {row.get('mmapped', 0):7.0f}")
    summary = out / "run" / "summary.json"
    if summary.exists():
        m = json.loads(summary.read_text())["metrics"]
        print(f"measured peak {m['perf/peak_memory_gib']:.3f} GiB, run estimate {m['perf/peak_memory_estimate_gib']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", action="store_true", help="also record at each block's forward and backward")
    parser.add_argument("--show", type=Path, help="print the timeline of an earlier invocation's folder")
    args, overrides = parser.parse_known_args()
    if args.show:
        show(args.show)
        return
    out = Path(tempfile.mkdtemp(prefix="rss-timeline-"))
    code = run(out, overrides, args.blocks)
    show(out)
    print(f"run and timeline in {out}" + ("" if code == 0 else f" (the run exited {code}: {out / 'output.txt'})"))


if __name__ == "__main__":
    main()
