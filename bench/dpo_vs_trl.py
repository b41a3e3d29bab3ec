"""dpo-sweeps against TRL's DPOTrainer and against a bare PyTorch loop, on the same model, data and batches.

    pip install -e '.[bench]'            # TRL (optional: without it the TRL rows are skipped)
    python bench/dpo_vs_trl.py           # 3 rounds of ours, TRL, bare (how long: bench/README.md)
    python bench/dpo_vs_trl.py --smoke   # seconds: tiny data, ours and bare only (what CI runs)
    python bench/dpo_vs_trl.py --model smollm2_135m   # pretrained SmolLM2-135M-Instruct: 96 pairs, 12 steps,
                                                      # max_length 128, its chat template
    python bench/dpo_vs_trl.py --model smollm2_135m --peft lora --frameworks ours,trl,trl_precompute
        # LoRA r=16 (alpha 32) on every linear layer of the blocks, ours (peft=lora) against TRL's
        # DPOTrainer with the same peft_config, at its defaults and with precomputed reference log-probs
    python bench/dpo_vs_trl.py --model smollm2_135m --max-length 512 --max-prompt-length 256 \
        --variant packed:train.packing=true,data.length_grouped=false   # HH at its natural lengths, packed too
    python bench/dpo_vs_trl.py --allocator tcmalloc   # every framework's process with gperftools' tcmalloc

The workload (the issue's): a GPT-2-style model, 4 layers x 256 wide, with the 4,096-token BPE
dpo-sweeps trains on the run's data (conf/model/bench_gpt2.yaml); 256 HH harmless pairs
(../shared/data/hh-rlhf), max_length 256, max_prompt_length 128, batch 8, beta 0.1, fp32, AdamW,
32 steps (one epoch). All three start from the same saved initial weights and see the same
tokenized pairs; the tokenizer is saved to a folder TRL loads.

- ours: the real CLI, `python -m dpo_sweeps model=bench_gpt2 data=hh ...` with its defaults (the
  speed and memory techniques on); `--variant NAME:k=v,k=v` adds runs with other overrides.
- trl: `DPOTrainer` with its defaults for this case (sigmoid loss, reference forward each step, no
  gradient checkpointing, 0 dataloader workers, no eval, no saving, report_to none); the
  pre-tokenized pairs are handed over as they are, so TRL trains on exactly our token sequences.
- bare: the limit, a plain PyTorch loop doing what ours does per step on the same collated batches
  (built before timing): policy forward and backward, reference log-probs, gradient clipping, AdamW
  step. No Trainer, no FSDP, no Hydra, no logging.

Each run is its own process, with oneDNN's primitive cache bounded as dpo-sweeps bounds its own
(runtime/startup.py) and the same malloc (`--allocator`: glibc's, or tcmalloc preloaded into every
framework's process, ours told so by resources.cpu_allocator so that it trains in that process); the frameworks alternate within each round (ours, TRL, bare, ours, ...)
because other work on a shared machine makes timings drift. Measured the same way for all:
- steady pairs/s: pairs of the steps after `--warmup` steps over the wall time from the end of the
  last warm-up step to the end of the last step (everything each framework does between steps
  counts: collation, logging, progress bars);
- tokens/s: non-padding tokens of those steps' [2B, L] sequences over the same time;
- epoch pairs/s: all pairs over all steps, plus any one-time reference pass (ours precomputes);
- peak RSS: the process's peak resident set (ru_maxrss from wait4), imports and data included.
The table shows the median over rounds, and the spread (min-max) so the noise is visible.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dpo_vs_trl_runs import FULL, HH, REPO, SMOKE, SMOLLM2, prepare, run_bare, run_ours, run_trl

from dpo_sweeps.parallel.allocator import missing_allocator, preloaded
from dpo_sweeps.runtime.startup import ONEDNN_CACHE_CAPACITY, ONEDNN_CACHE_ENV


# ---------------------------------------------------------------------------------------------- driver
def measure(result: dict, w: dict, peak_rss_kb: int) -> dict:
    wall, tokens, k = result["wall"], result["tokens"], w["warmup"]
    timed = len(wall) - k
    span = wall[-1] - wall[k - 1]
    cpu_span = result["cpu"][-1] - result["cpu"][k - 1]
    steady_tokens = sum(tokens[k:]) if len(tokens) == len(wall) else None
    epoch_s = wall[-1] - result["start_wall"] + result["one_time_s"]
    return {
        "pairs_per_s": timed * w["batch"] / span,
        "tokens_per_s": steady_tokens / span if steady_tokens is not None else None,
        "step_time_s": span / timed,
        "cpu_s_per_step": cpu_span / timed,
        "epoch_pairs_per_s": len(wall) * w["batch"] / epoch_s,
        "one_time_s": result["one_time_s"],
        "peak_rss_gb": peak_rss_kb * 1024 / 1e9,
        "intervals": [b - a for a, b in zip(wall[k - 1 : -1], wall[k:])],  # the timed steps, in order
    }


def spawn(kind: str, workdir: Path, out: Path, log: Path, extra: list[str], cache: Path,
          allocator: str) -> tuple[dict, int]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run", kind, "--workdir", str(workdir), "--out", str(out)]
    cmd += [f"--override={o}" for o in extra]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               DPO_SWEEPS_CACHE=str(cache), PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # Every framework's process gets the oneDNN cache bound dpo-sweeps' own processes set themselves
    # (runtime/startup.py): the comparison is of the frameworks, not of that environment variable.
    env.setdefault(ONEDNN_CACHE_ENV, str(ONEDNN_CACHE_CAPACITY))
    preloaded(allocator, env)  # and the same malloc (glibc: as the environment has it)
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{kind} failed (exit {os.waitstatus_to_exitcode(status)}); see {log}")
    return json.loads(out.read_text()), usage.ru_maxrss


def fresh_cache(workdir: Path, name: str) -> Path:
    """A cache folder per run that shares the trained tokenizer but no reference log-probs: every ours
    run pays its own reference pass, as a first run would."""
    cache = workdir / "caches" / name
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    (cache / "tokenizers").symlink_to(workdir / "shared_cache" / "tokenizers")
    (cache / "gguf").symlink_to(workdir / "shared_cache" / "gguf")  # a GGUF model, dequantized once
    return cache


def fmt(values: list[float], digits: int = 2) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def report(rows: dict[str, list[dict]], w: dict) -> str:
    lines = [f"{'run':<14} {'pairs/s':>20} {'tokens/s':>22} {'step s':>20} {'CPU s/step':>18} "
             f"{'epoch pairs/s':>20} {'one-time s':>18} {'peak RSS GB':>20}"]
    for name, runs in rows.items():
        col = lambda key, d=2, runs=runs: fmt([r[key] for r in runs], d)  # noqa: E731
        lines.append(f"{name:<14} {col('pairs_per_s'):>20} {col('tokens_per_s', 0):>22} {col('step_time_s', 3):>20} "
                     f"{col('cpu_s_per_step', 3):>18} {col('epoch_pairs_per_s'):>20} {col('one_time_s', 1):>18} "
                     f"{col('peak_rss_gb', 3):>20}")
    med = {name: {k: statistics.median([r[k] for r in runs if r[k] is not None] or [0]) for k in runs[0]
                  if k != "intervals"} for name, runs in rows.items()}
    # Best of rounds, step by step: other work on the machine only ever adds time, so the fastest of
    # the rounds for each step is the closest to the uncontended cost. Same batches each round.
    best = {name: sum(min(steps) for steps in zip(*(r["intervals"] for r in runs))) for name, runs in rows.items()}
    lines.append("")
    lines.append("best of rounds per step (pairs/s): " + ", ".join(
        f"{name} {len(rows[name][0]['intervals']) * w['batch'] / t:.2f}" for name, t in best.items()))
    if "ours" in med and "trl" in med:
        o, t = med["ours"], med["trl"]
        lines.append(f"ours / TRL: pairs/s x{o['pairs_per_s'] / t['pairs_per_s']:.2f}, tokens/s "
                     f"x{(o['tokens_per_s'] or 0) / (t['tokens_per_s'] or 1):.2f}, epoch pairs/s "
                     f"x{o['epoch_pairs_per_s'] / t['epoch_pairs_per_s']:.2f}, "
                     f"peak RSS x{o['peak_rss_gb'] / t['peak_rss_gb']:.2f}")
        lines.append(f"ours / TRL, best of rounds: pairs/s x{best['trl'] / best['ours']:.2f}")
    if "ours" in med and "bare" in med:
        o, b = med["ours"], med["bare"]
        lines.append(f"ours / bare: step time x{o['step_time_s'] / b['step_time_s']:.3f} (best of rounds "
                     f"x{best['ours'] / best['bare']:.3f}), "
                     f"CPU per step x{o['cpu_s_per_step'] / b['cpu_s_per_step']:.3f}")
    lines.append(f"(median over {len(next(iter(rows.values())))} rounds, min-max in brackets; {w['pairs']} pairs, "
                 f"{w['steps']} steps of {w['batch']}, first {w['warmup']} steps not timed)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dpo-bench"))
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--frameworks", default="ours,trl,bare",
                        help="comma-separated among ours, trl, trl_precompute, bare (default: ours,trl,bare)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:override,override - another ours run with these dpo-sweeps overrides")
    parser.add_argument("--smoke", action="store_true", help="seconds-long: tiny data, few steps, one round")
    parser.add_argument("--model", default="bench_gpt2", choices=("bench_gpt2", "smollm2_135m"),
                        help="conf/model preset of all runs (smollm2_135m: pretrained, its chat template on HH)")
    parser.add_argument("--peft", choices=("none", "lora"), default="none",
                        help="lora: every framework trains LoRA adapters (--lora-r) instead of all weights (no bare run)")
    parser.add_argument("--lora-r", type=int, default=16, help="with --peft lora: the adapters' rank (alpha 2r)")
    parser.add_argument("--allocator", choices=("glibc", "tcmalloc"), default="glibc",
                        help="the malloc of every framework's process (ours: resources.cpu_allocator)")
    parser.add_argument("--max-length", type=int, help="data.max_length of every run (HH's natural: 512)")
    parser.add_argument("--max-prompt-length", type=int, help="data.max_prompt_length (HH's natural: 256)")
    parser.add_argument("--pairs", type=int, help="training pairs (steps = pairs / batch)")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--override", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.run:  # one measured run, in its own process
        w = json.loads((args.workdir / "workload.json").read_text())
        if args.run == "ours":
            run_ours(args.workdir, w, args.out, args.override)
        elif args.run in ("trl", "trl_precompute"):
            run_trl(args.workdir, w, args.out, precompute=args.run == "trl_precompute")
        elif args.run == "bare":
            run_bare(args.workdir, w, args.out)
        return

    full = SMOLLM2 if args.model == "smollm2_135m" else FULL
    if problem := missing_allocator(args.allocator):
        raise SystemExit(f"--allocator {args.allocator}: {problem}")
    w = dict(SMOKE if args.smoke else full, data_path=str(HH), model=args.model,
             peft_r=args.lora_r if args.peft == "lora" else None, allocator=args.allocator)
    if args.rounds:
        w["rounds"] = args.rounds
    for key in ("max_length", "max_prompt_length", "pairs"):
        if getattr(args, key):
            w[key] = getattr(args, key)
    if args.pairs:  # one epoch, as the presets
        w["steps"] = args.pairs // w["batch"]
    kinds = [k.strip() for k in args.frameworks.split(",") if k.strip()]
    if w["peft_r"] and "bare" in kinds:  # the bare loop trains every weight
        print("--peft lora: no bare run (it trains every weight)", file=sys.stderr)
        kinds.remove("bare")
    if any(k.startswith("trl") for k in kinds):
        try:
            import trl  # noqa: F401
        except ImportError:
            print("trl is not installed (pip install -e '.[bench]'): skipping the TRL runs", file=sys.stderr)
            kinds = [k for k in kinds if not k.startswith("trl")]
    variants = {"ours": []}
    for spec in args.variant:
        name, _, overrides = spec.partition(":")
        variants[name] = [o for o in overrides.split(",") if o]
    runs = [(k, variants["ours"]) if k == "ours" else (k, []) for k in kinds]
    runs += [(name, extra) for name, extra in variants.items() if name != "ours"]

    workdir = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ["DPO_SWEEPS_CACHE"] = str(workdir / "shared_cache")
    started = time.time()
    prepare(workdir, w)
    rows: dict[str, list[dict]] = {name: [] for name, _ in runs}
    for r in range(w["rounds"]):
        order = runs[r % len(runs):] + runs[: r % len(runs)]  # rotate who goes first
        for name, extra in order:
            kind = "ours" if name in variants else name
            tag = f"{name}-{r}"
            result, rss = spawn(kind, workdir, workdir / f"{tag}.json", workdir / f"{tag}.log", extra,
                                fresh_cache(workdir, tag), w["allocator"])
            rows[name].append(measure(result, w, rss))
            print(f"round {r + 1}/{w['rounds']} {name:<14} " + ", ".join(
                f"{k} {v:.3f}" for k, v in rows[name][-1].items() if isinstance(v, float)), flush=True)
    text = report(rows, w)
    print("\n" + text)
    (workdir / "results.json").write_text(json.dumps({"workload": w, "runs": rows, "variants": variants,
                                                      "load_average": os.getloadavg(),
                                                      "minutes": (time.time() - started) / 60}, indent=1))
    (workdir / "results.txt").write_text(text + "\n")
    print(f"\nresults: {workdir / 'results.json'} "
          f"(load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
