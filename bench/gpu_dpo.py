"""DPO steps of a 1B-class model on one GPU, in fp32, bf16 and fp16: tokens/s, MFU and peak memory.

    python bench/gpu_dpo.py                 # one GPU, no network (how long: bench/README.md)
    python bench/gpu_dpo.py --tiny          # seconds on a CPU: the same path with a tiny model

Each precision is one real run of the CLI (`python -m dpo_sweeps model=llama_1b precision=P ...`,
the Llama-3.2-1B architecture with random weights and a 32,000-token BPE trained on the data), on a
synthetic preference file the script writes (random words, so nothing is downloaded), with the
speed and memory techniques at their defaults; a last bf16 run turns them off for comparison.
Numbers come from each run's summary.json: perf/tokens_per_s, perf/mfu (the step's model FLOPs,
dpo_sweeps/parallel/mfu.py, against the GPU's dense peak for the dtype; fp32 against the plain fp32 peak, as
TF32 is not enabled), perf/peak_memory_gib (max allocated) beside memory_estimate.py's estimate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FULL = dict(model="model=llama_1b", pairs=1200, prompt_words=420, response_words=200, max_length=1024,
            max_prompt_length=512, batch=16, micro=8, steps=12, warmup=4, precisions=("fp32", "bf16", "fp16"))
TINY = dict(model="model=tiny_llama", pairs=96, prompt_words=30, response_words=12, max_length=96,
            max_prompt_length=64, batch=8, micro=4, steps=4, warmup=1, precisions=("fp32", "bf16", "fp16"))
TECHNIQUES_OFF = ["train.precompute_reference_logps=false", "train.logps_chunk_size=0", "data.length_grouped=false"]


def write_pairs(path: Path, w: dict, seed: int = 0) -> None:
    """Prompt / chosen / rejected text of random words (a few thousand distinct ones, Zipf-like)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(6000)]
    weights = [1 / (i + 1) for i in range(len(words))]

    def text(n: int) -> str:
        return " ".join(rng.choices(words, weights, k=rng.randint(n // 2, n)))

    with path.open("w") as f:
        for _ in range(w["pairs"]):
            f.write(json.dumps({"prompt": text(w["prompt_words"]) + "\nanswer:",
                                "chosen": " " + text(w["response_words"]),
                                "rejected": " " + text(w["response_words"])}) + "\n")


def run(workdir: Path, name: str, w: dict, precision: str, extra: list[str], device: str) -> dict:
    run_dir = workdir / name
    cmd = [sys.executable, "-m", "dpo_sweeps", w["model"], "data=preference",
           f"data.path={workdir / 'pairs.jsonl'}",
           f"data.max_length={w['max_length']}", f"data.max_prompt_length={w['max_prompt_length']}",
           f"precision={precision}", f"train.batch_size={w['batch']}", f"train.micro_batch_size={w['micro']}",
           f"train.max_steps={w['steps']}", f"perf.warmup_steps={w['warmup']}", "train.eval_every=0",
           f"train.eval_max_pairs={w['micro']}", f"data.eval_size={w['micro']}", "train.save_model=false",
           "checkpoint.every_steps=0", "tracking.wandb.mode=disabled", "train.progress_bar=false", f"resources.device={device}",
           f"hydra.run.dir={run_dir}", *extra]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               DPO_SWEEPS_CACHE=str(workdir / "cache"))
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    (workdir / f"{name}.log").write_text(proc.stdout + proc.stderr)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    m = summary.get("metrics", {})
    return {"run": name, "precision": precision, "status": summary.get("status", f"exit {proc.returncode}"),
            "failure": (summary.get("failure") or {}).get("message"), "tokens_per_s": m.get("perf/tokens_per_s"),
            "mfu": m.get("perf/mfu"), "peak_gib": m.get("perf/peak_memory_gib"),
            "estimate_gib": m.get("perf/peak_memory_estimate_gib"), "step_s": m.get("perf/step_time_s"),
            "params_m": (m.get("num_params") or 0) / 1e6, "train_loss": m.get("train/loss"),
            "wall_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model and data, for a CPU smoke test")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dpo-gpu-bench"))
    parser.add_argument("--device", default="auto", help="resources.device (auto: cuda when available)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the bf16 run with the techniques off")
    parser.add_argument("--precisions", help="comma-separated subset of fp32,bf16,fp16 (default: all three)")
    args = parser.parse_args()
    w = dict(TINY if args.tiny else FULL)
    if args.precisions:
        w["precisions"] = tuple(p.strip() for p in args.precisions.split(",") if p.strip())
    args.workdir.mkdir(parents=True, exist_ok=True)
    write_pairs(args.workdir / "pairs.jsonl", w)
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except Exception as exc:  # noqa: BLE001 - only for the header line
        gpu = f"unknown ({exc})"
    print(f"device: {gpu}; {w['model']}, {w['batch']} pairs per step ({w['micro']} per forward), max_length "
          f"{w['max_length']}, {w['steps']} steps ({w['warmup']} untimed)", flush=True)

    plan = [(p, p, []) for p in w["precisions"]]
    if not args.no_baseline:
        plan.append(("bf16-techniques-off", "bf16", TECHNIQUES_OFF))
    started = time.perf_counter()
    results = []
    header = f"{'run':<22}{'status':<11}{'params M':>9}{'tokens/s':>11}{'MFU':>8}{'step s':>9}{'peak GiB':>10}" \
             f"{'estimate':>10}{'wall s':>8}"
    print(header, flush=True)
    for name, precision, extra in plan:
        r = run(args.workdir, name, w, precision, extra, args.device)
        results.append(r)

        def num(key, fmt, r=r):
            return format(r[key], fmt) if isinstance(r[key], (int, float)) else "-"

        print(f"{name:<22}{r['status']:<11}{r['params_m']:>9.1f}{num('tokens_per_s', '.0f'):>11}"
              f"{(format(100 * r['mfu'], '.1f') + '%') if r['mfu'] else '-':>8}{num('step_s', '.3f'):>9}"
              f"{num('peak_gib', '.2f'):>10}{num('estimate_gib', '.2f'):>10}{r['wall_s']:>8.0f}", flush=True)
        if r["failure"]:
            print(f"    {r['failure']}", flush=True)
    (args.workdir / "results.json").write_text(json.dumps({"device": gpu, "workload": w, "runs": results}, indent=1))
    print(f"total {time.perf_counter() - started:.0f}s; results in {args.workdir / 'results.json'}")


if __name__ == "__main__":
    main()
