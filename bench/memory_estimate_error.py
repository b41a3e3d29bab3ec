"""How close the memory estimate is to the measured peak: 14 shapes, probed on CPU.

    python bench/memory_estimate_error.py              # how long: bench/README.md
    python bench/memory_estimate_error.py --reuse DIR  # re-read the runs of an earlier invocation
    python bench/memory_estimate_error.py --model smollm2_135m   # 8 shapes of pretrained SmolLM2-135M
    python bench/memory_estimate_error.py --repeat 3   # each shape 3 times, round by round: median and range
    python bench/memory_estimate_error.py --steps 24   # longer probes: the peak a longer run reaches
    python bench/memory_estimate_error.py --model smollm2_135m_lora   # 13 LoRA shapes of SmolLM2-135M (peft=lora)
    python bench/memory_estimate_error.py --model smollm2_135m_packed   # 4 packed shapes of SmolLM2-135M (train.packing)
    python bench/memory_estimate_error.py --allocator tcmalloc   # every probe with resources.cpu_allocator=tcmalloc

Each shape is a real probe run (`probe.steps=6`, or `--steps`; the same sharding, precision, micro-batch and
techniques as a full run) on synthetic data; its summary.json has the measured peak
(`perf/peak_memory_gib`: the busiest rank's peak resident memory) and the run's own estimate
(`perf/peak_memory_estimate_gib`, from the model it built and the longest row it saw). Beside them,
the estimate the fit check makes before launch (dpo_sweeps/parallel/fit.py: the config alone, every pair at its
longest, data/rows.py), computed here from the same config. The shapes cover three models (tiny_gpt2, tiny_llama and
bench_gpt2 with its 4,096-token BPE), full_shard / shard_grad_op / no_shard on 2 ranks and 1 rank,
fp32 and bf16, micro-batches of 4 and 16 pairs, and activation checkpointing. CPU offload is refused on
a CPU-only run (there is no device memory to offload from), so it is not measured here.

A CPU peak is a resident set, and part of it is freed memory glibc's heap keeps (memory_estimate.py's
`heap_kept`), which depends on the order in which tensors happen to be freed: the same shape's peak moves
between runs. `--repeat N` probes every shape N times, one round of all shapes after another, and takes
each error against the median, with the runs' range beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROBE_STEPS = 6
COMMON = ["tracking.wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false",
          "perf.warmup_steps=1", "data.num_train_pairs=512", "data.num_eval_pairs=64", "resources.device=cpu"]

# (name, overrides): model x strategy x precision x micro-batch x activation checkpointing.
SHAPES = [
    ("gpt2-fs-fp32-mb8", ["model=tiny_gpt2", "fsdp=full_shard", "precision=fp32", "resources.nproc_per_node=2"]),
    ("gpt2-sgo-bf16-mb8", ["model=tiny_gpt2", "fsdp=shard_grad_op", "precision=bf16", "resources.nproc_per_node=2"]),
    ("gpt2-ns-fp32-mb16", ["model=tiny_gpt2", "fsdp=no_shard", "precision=fp32", "resources.nproc_per_node=2",
                           "train.micro_batch_size=16"]),
    ("gpt2-1rank-fp32-mb4", ["model=tiny_gpt2", "precision=fp32", "train.micro_batch_size=4"]),
    ("llama-fs-fp32-mb8", ["model=tiny_llama", "fsdp=full_shard", "precision=fp32", "resources.nproc_per_node=2"]),
    ("llama-fs-bf16-mb8-ac", ["model=tiny_llama", "fsdp=full_shard", "precision=bf16", "resources.nproc_per_node=2",
                              "fsdp.activation_checkpointing=true"]),
    ("llama-sgo-fp32-mb16", ["model=tiny_llama", "fsdp=shard_grad_op", "precision=fp32", "resources.nproc_per_node=2",
                             "train.micro_batch_size=16"]),
    ("llama-1rank-bf16-mb4", ["model=tiny_llama", "precision=bf16", "train.micro_batch_size=4"]),
    ("bench-fs-fp32-mb8", ["model=bench_gpt2", "fsdp=full_shard", "precision=fp32", "resources.nproc_per_node=2"]),
    ("bench-fs-fp32-mb8-ac", ["model=bench_gpt2", "fsdp=full_shard", "precision=fp32", "resources.nproc_per_node=2",
                              "fsdp.activation_checkpointing=true"]),
    ("bench-sgo-bf16-mb8", ["model=bench_gpt2", "fsdp=shard_grad_op", "precision=bf16", "resources.nproc_per_node=2"]),
    ("bench-ns-bf16-mb16", ["model=bench_gpt2", "fsdp=no_shard", "precision=bf16", "resources.nproc_per_node=2",
                            "train.micro_batch_size=16"]),
    ("bench-1rank-fp32-mb16", ["model=bench_gpt2", "precision=fp32", "train.micro_batch_size=16"]),
    ("bench-1rank-bf16-mb4-ac", ["model=bench_gpt2", "precision=bf16", "train.micro_batch_size=4",
                                 "fsdp.activation_checkpointing=true"]),
]

# The same for SmolLM2-135M-Instruct (model=smollm2_135m: 30 layers x 576, a 49,152-token vocabulary, tied
# embeddings), on the same synthetic pairs through its own tokenizer.
SMOLLM2 = ["model=smollm2_135m", "resources.nproc_per_node=2"]
SMOLLM2_SHAPES = [
    ("smol-fs-fp32-mb4", [*SMOLLM2, "fsdp=full_shard", "precision=fp32", "train.micro_batch_size=4"]),
    ("smol-fs-bf16-mb4", [*SMOLLM2, "fsdp=full_shard", "precision=bf16", "train.micro_batch_size=4"]),
    ("smol-sgo-fp32-mb4", [*SMOLLM2, "fsdp=shard_grad_op", "precision=fp32", "train.micro_batch_size=4"]),
    ("smol-sgo-bf16-mb8", [*SMOLLM2, "fsdp=shard_grad_op", "precision=bf16", "train.micro_batch_size=8"]),
    ("smol-ns-fp32-mb4", [*SMOLLM2, "fsdp=no_shard", "precision=fp32", "train.micro_batch_size=4"]),
    ("smol-fs-fp32-mb8-ac", [*SMOLLM2, "fsdp=full_shard", "precision=fp32", "train.micro_batch_size=8",
                             "fsdp.activation_checkpointing=true"]),
    ("smol-fs-bf16-mb16-ac", [*SMOLLM2, "fsdp=full_shard", "precision=bf16", "train.micro_batch_size=16",
                              "train.batch_size=32", "fsdp.activation_checkpointing=true"]),
    ("smol-1rank-fp32-mb4", ["model=smollm2_135m", "precision=fp32", "train.micro_batch_size=4"]),
]
# LoRA (peft=lora, issue 36): peft x strategy x micro-batch x r on SmolLM2, the reference the base with the
# adapters off; the first two with the reference scored every step (no precomputed log-probs).
LORA = [*SMOLLM2, "peft=lora"]
SMOLLM2_LORA_SHAPES = [
    ("smol-lora16-fs-fp32-mb4-ref", [*LORA, "peft.r=16", "fsdp=full_shard", "precision=fp32", "train.micro_batch_size=4",
                                     "train.precompute_reference_logps=false"]),
    ("smol-lora16-sgo-bf16-mb8-ref", [*LORA, "peft.r=16", "fsdp=shard_grad_op", "precision=bf16",
                                      "train.micro_batch_size=8", "train.precompute_reference_logps=false"]),
    ("smol-lora16-fs-bf16-mb4", [*LORA, "peft.r=16", "fsdp=full_shard", "precision=bf16", "train.micro_batch_size=4"]),
    ("smol-lora64-fs-fp32-mb4", [*LORA, "peft.r=64", "fsdp=full_shard", "precision=fp32", "train.micro_batch_size=4"]),
    ("smol-lora8-sgo-fp32-mb8", [*LORA, "peft.r=8", "fsdp=shard_grad_op", "precision=fp32", "train.micro_batch_size=8"]),
    ("smol-lora16-ns-bf16-mb4", [*LORA, "peft.r=16", "fsdp=no_shard", "precision=bf16", "train.micro_batch_size=4"]),
    ("smol-lora16-fs-fp32-mb8-ac", [*LORA, "peft.r=16", "fsdp=full_shard", "precision=fp32", "train.micro_batch_size=8",
                                    "fsdp.activation_checkpointing=true"]),
    # Beside it: the same without checkpointing, kept gathered, and in bf16 (how adapters split the gathers).
    ("smol-lora16-fs-fp32-mb8", [*LORA, "peft.r=16", "fsdp=full_shard", "precision=fp32", "train.micro_batch_size=8"]),
    ("smol-lora16-sgo-fp32-mb8-ac", [*LORA, "peft.r=16", "fsdp=shard_grad_op", "precision=fp32",
                                     "train.micro_batch_size=8", "fsdp.activation_checkpointing=true"]),
    ("smol-lora16-fs-bf16-mb8-ac", [*LORA, "peft.r=16", "fsdp=full_shard", "precision=bf16", "train.micro_batch_size=8",
                                    "fsdp.activation_checkpointing=true"]),
    ("smol-lora16-1rank-fp32-mb4", ["model=smollm2_135m", "peft=lora", "peft.r=16", "precision=fp32",
                                    "train.micro_batch_size=4"]),
    # One rank in fp32 is the one plan fully_shard does not wrap, whose heap keeps its activations' holes.
    ("smol-lora16-1rank-fp32-mb8", ["model=smollm2_135m", "peft=lora", "peft.r=16", "precision=fp32",
                                    "train.micro_batch_size=8"]),
    ("smol-lora8-1rank-fp32-mb4-ac", ["model=smollm2_135m", "peft=lora", "peft.r=8", "precision=fp32",
                                      "train.micro_batch_size=4", "fsdp.activation_checkpointing=true"]),
]
# Packed rows (train.packing, issue 47), which the estimate counts at the longest pairs, as many to a row as
# train.micro_batch_tokens takes, under one boolean [R, 1, L, L] mask (memory_estimate.py `_row_layout`): the
# default budget (a pair a row at its longest), and budgets that take several pairs a row, prefix-shared
# and not, with and without activation checkpointing.
SMOLLM2_PACKED_SHAPES = [
    ("smol-fs-fp32-mb8-packed", [*SMOLLM2, "fsdp=full_shard", "precision=fp32", "train.micro_batch_size=8",
                                 "train.packing=true"]),
    ("smol-fs-bf16-mb8-packed512", [*SMOLLM2, "fsdp=full_shard", "precision=bf16", "train.micro_batch_size=8",
                                    "train.packing=true", "train.micro_batch_tokens=512"]),
    ("smol-sgo-fp32-mb16-packed1024-ac", [*SMOLLM2, "fsdp=shard_grad_op", "precision=fp32",
                                          "train.micro_batch_size=16", "train.batch_size=32", "train.packing=true",
                                          "train.micro_batch_tokens=1024", "fsdp.activation_checkpointing=true"]),
    ("smol-1rank-fp32-mb8-packed256-apart", ["model=smollm2_135m", "precision=fp32", "train.micro_batch_size=8",
                                             "train.packing=true", "train.micro_batch_tokens=256",
                                             "train.share_prompt=false"]),
]
# Two tiny LoRA shapes: that the LoRA rows run, in seconds.
TINY_LORA_SHAPES = [
    ("llama-lora4-fs-fp32-mb8", ["model=tiny_llama", "peft=lora", "peft.r=4", "fsdp=full_shard", "precision=fp32",
                                 "resources.nproc_per_node=2"]),
    ("llama-lora4-sgo-bf16-mb8-ref", ["model=tiny_llama", "peft=lora", "peft.r=4", "fsdp=shard_grad_op",
                                      "precision=bf16", "resources.nproc_per_node=2",
                                      "train.precompute_reference_logps=false"]),
]
SHAPE_SETS = {"tiny": SHAPES, "smollm2_135m": SMOLLM2_SHAPES, "smollm2_135m_lora": SMOLLM2_LORA_SHAPES,
              "smollm2_135m_packed": SMOLLM2_PACKED_SHAPES, "tiny_lora": TINY_LORA_SHAPES}


def probe(run_dir: Path, overrides: list[str], steps: int = PROBE_STEPS) -> dict:
    """One probe run of the shape; its summary.json."""
    args = [sys.executable, "-m", "dpo_sweeps", *COMMON, f"probe.steps={steps}", *overrides,
            f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{run_dir.name} failed:\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def prelaunch_estimate(overrides: list[str]) -> float:
    """The fit check's estimate of the same config, before anything runs (dpo_sweeps/parallel/fit.py)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.parallel.fit import predicted_peak_gib

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*COMMON, *overrides])
    cfg = Config.of(OmegaConf.to_container(cfg, resolve=True))
    return predicted_peak_gib(cfg, cfg.world_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reuse", type=Path, help="a folder of earlier runs (one per shape) to read again")
    parser.add_argument("--model", default="tiny", choices=sorted(SHAPE_SETS),
                        help="tiny: the 14 shapes of tiny_gpt2, tiny_llama and bench_gpt2 (default); "
                             "smollm2_135m: 8 shapes of SmolLM2-135M-Instruct; smollm2_135m_lora: 13 LoRA "
                             "shapes of it; smollm2_135m_packed: 4 packed shapes of it (train.packing); "
                             "tiny_lora: 2 LoRA shapes of tiny_llama")
    parser.add_argument("--only", help="comma-separated shape names to run (default: all of --model's)")
    parser.add_argument("--repeat", type=int, default=1, help="probe every shape this many times, round by round")
    parser.add_argument("--allocator", choices=("auto", "glibc", "tcmalloc"), default="auto",
                        help="resources.cpu_allocator of every probe and of the pre-launch estimate")
    parser.add_argument("--steps", type=int, default=PROBE_STEPS, help="steps of each probe: the heap can grow "
                        f"for longer than {PROBE_STEPS} (bench/README.md)")
    args = parser.parse_args()
    root = args.reuse or Path(tempfile.mkdtemp(prefix="memory-estimate-"))
    shapes = [(name, [*o, f"resources.cpu_allocator={args.allocator}"]) for name, o in SHAPE_SETS[args.model]]
    if args.only:
        shapes = [(name, o) for name, o in shapes if name in args.only.split(",")]
    measured: dict[str, list[float]] = {name: [] for name, _ in shapes}
    in_run: dict[str, list[float]] = {name: [] for name, _ in shapes}
    for k in range(args.repeat):  # round by round, so that a slow drift of the machine touches every shape
        for name, overrides in shapes:
            run_dir = root / name if args.repeat == 1 else root / name / f"run-{k}"
            summary = json.loads((run_dir / "summary.json").read_text()) if args.reuse else probe(run_dir, overrides, args.steps)
            measured[name].append(summary["metrics"]["perf/peak_memory_gib"])
            in_run[name].append(summary["metrics"]["perf/peak_memory_estimate_gib"])
    rows = [(name, statistics.median(measured[name]), min(measured[name]), max(measured[name]),
             statistics.median(in_run[name]), prelaunch_estimate(overrides)) for name, overrides in shapes]
    print(f"runs in {root}\n")
    spread = args.repeat > 1
    print(f"{'shape':26} {'measured GiB':>12} " + (f"{'range':>13} " if spread else "")
          + f"{'run estimate':>12} {'error':>7} {'pre-launch':>10} {'error':>7}")
    for name, mid, low, high, run_est, before in rows:
        print(f"{name:26} {mid:12.3f} " + (f"{low:6.3f}-{high:6.3f} " if spread else "")
              + f"{run_est:12.3f} {100 * (run_est / mid - 1):+6.1f}% "
              f"{before:10.3f} {100 * (before / mid - 1):+6.1f}%")
    worst_run = max(abs(r[4] / r[1] - 1) for r in rows)
    worst_before = max(abs(r[5] / r[1] - 1) for r in rows)
    what = f"the median of {args.repeat} runs" if spread else "the measured peak"
    print(f"\nlargest error against {what}: run estimate {100 * worst_run:.1f}%, "
          f"pre-launch estimate {100 * worst_before:.1f}% over {len(rows)} shapes")


if __name__ == "__main__":
    main()
