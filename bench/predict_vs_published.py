"""Predicted against published training throughput: how far to trust dpo_sweeps/cost/step_time.py.

    python bench/predict_vs_published.py bench/data/llm_foundry.csv   # the calibration set (fitted on)
    python bench/predict_vs_published.py bench/data/held_out.csv       # other stacks and papers (never fitted)

Each CSV row is a plain causal-LM training step as the tables measure it (every token trained, no
reference): gpu (a conf/cluster profile name), gpus, gpus_per_node, n_layers, d_model, n_heads, n_kv_heads,
ffn_hidden, vocab, seq_len, micro_batch, grad_accum, activation_checkpointing (none, selective, full),
precision (fp32, bf16, fp16), strategy (full_shard, shard_grad_op, hybrid_shard), tokens_per_s_per_gpu;
optional gated_mlp (1: three MLP matrices, as Llama's) and source. Prints per row the predicted tokens/s per
GPU, its interval and the error, then the median absolute percentage error and the share of rows inside
their interval.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys

from dpo_sweeps.cost.predict import device_profile
from dpo_sweeps.cost.profile import builtin_cluster
from dpo_sweeps.cost.step_time import Layout, Workload, predict_step

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def workload_of(row: dict) -> Workload:
    d, heads, kv = int(row["d_model"]), int(row["n_heads"]), int(row["n_kv_heads"])
    layers, ffn = int(row["n_layers"]), int(row["ffn_hidden"])
    kv_dim = kv * (d // heads)
    mlp = (3 if int(row.get("gated_mlp") or 0) else 2) * d * ffn
    block = layers * (2 * d * d + 2 * d * kv_dim + mlp)
    mb, seq = int(row["micro_batch"]), int(row["seq_len"])
    return Workload(num_layers=layers, hidden=d, block_params=block, head_params=int(row["vocab"]) * d,
                    positions=mb * seq, scored=mb * seq, attention=mb * seq * seq,
                    micro_batches=int(row["grad_accum"]), recompute=row["activation_checkpointing"])


def layout_of(row: dict) -> Layout:
    gpus, per_node = int(row["gpus"]), int(row["gpus_per_node"])
    strategy = row["strategy"]
    shard = min(per_node, gpus) if strategy == "hybrid_shard" else gpus
    return Layout(world_size=gpus, ranks_per_node=per_node, shard_size=shard, replicate_size=gpus // shard,
                  reshard_after_forward=strategy != "shard_grad_op", param_bytes=BYTES[row["precision"]],
                  reduce_bytes=4, compute=row["precision"])


def predicted(row: dict, calibration: dict | None = None):
    """The prediction of a row's tokens/s per GPU (an Estimate)."""
    profile = device_profile(builtin_cluster(row["gpu"]))
    work = workload_of(row)
    return predict_step(work, layout_of(row), profile, calibration).tokens_per_s_per_device


def log_errors(rows: list[dict], calibration: dict) -> list[float]:
    return [math.log(predicted(r, calibration).value / float(r["tokens_per_s_per_gpu"])) for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    args = parser.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    errors, inside = [], 0
    print(f"{'gpu':10} {'gpus':>5} {'L':>3} {'d':>5} {'seq':>6} {'mb':>3} {'ga':>3} {'ac':9} {'strategy':13} "
          f"{'measured':>9} {'predicted [interval]':>27} {'error':>7}")
    for r in rows:
        e = predicted(r)
        measured = float(r["tokens_per_s_per_gpu"])
        error = (e.value - measured) / measured
        errors.append(abs(error))
        inside += e.low <= measured <= e.high
        print(f"{r['gpu']:10} {r['gpus']:>5} {r['n_layers']:>3} {r['d_model']:>5} {r['seq_len']:>6} "
              f"{r['micro_batch']:>3} {r['grad_accum']:>3} {r['activation_checkpointing']:9} {r['strategy']:13} "
              f"{measured:>9,.0f} {e.value:>9,.0f} [{e.low:>7,.0f}-{e.high:>7,.0f}] {100 * error:>+6.1f}%")
    print(f"\n{len(rows)} rows: median absolute error {100 * statistics.median(errors):.1f}%, worst "
          f"{100 * max(errors):.1f}%, {inside} of {len(rows)} ({100 * inside / len(rows):.0f}%) inside their interval")
    return 0


if __name__ == "__main__":
    sys.exit(main())
