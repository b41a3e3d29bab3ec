"""dpo-sweeps against TRL's DPOTrainer and against a bare PyTorch loop, on the same model, data and batches.

    pip install -e '.[bench]'            # TRL (optional: without it the TRL rows are skipped)
    python bench/dpo_vs_trl.py           # 3 rounds of ours, TRL, bare (about 15 min on 2 CPU cores)
    python bench/dpo_vs_trl.py --smoke   # seconds: tiny data, ours and bare only (what CI runs)

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

Each run is its own process; the frameworks alternate within each round (ours, TRL, bare, ours, ...)
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere, without installing
HH = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"

FULL = dict(pairs=256, steps=32, warmup=3, max_length=256, max_prompt_length=128, batch=8, rounds=3)
SMOKE = dict(pairs=16, steps=4, warmup=1, max_length=64, max_prompt_length=32, batch=4, rounds=1)
BETA, LR, WARMUP_STEPS, MAX_GRAD_NORM, SEED = 0.1, 3e-3, 10, 10.0, 0


# ---------------------------------------------------------------------------------------------- workload
def ours_overrides(w: dict, extra: list[str] = ()) -> list[str]:
    return ["model=bench_gpt2", "data=hh", f"data.path={w['data_path']}", f"data.max_pairs={w['pairs']}",
            f"data.max_length={w['max_length']}", f"data.max_prompt_length={w['max_prompt_length']}",
            f"train.batch_size={w['batch']}", f"train.micro_batch_size={w['batch']}", f"loss.beta={BETA}",
            f"train.lr={LR}", f"train.warmup_steps={WARMUP_STEPS}", f"train.max_grad_norm={MAX_GRAD_NORM}",
            f"train.seed={SEED}", f"train.max_steps={w['steps']}", f"perf.warmup_steps={w['warmup']}",
            "train.eval_every=0", "train.eval_max_pairs=8", "train.save_model=false", "checkpoint.every_steps=0",
            "wandb.mode=disabled", "train.progress_bar=false", *extra]


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return hydra_compose(config_name="config", overrides=overrides)


def prepare(workdir: Path, w: dict) -> None:
    """Tokenizer folder, initial weights and tokenized pairs, through dpo-sweeps' own data path."""
    from dpo_sweeps.data.encoding import encode_pairs, render_pair
    from dpo_sweeps.data.sources import load_preference_rows
    from dpo_sweeps.models.build import build_policy, build_tokenizer

    cfg = compose(ours_overrides(w))
    rows = load_preference_rows(cfg.data, REPO)
    plain = [render_pair(r) for r in rows.train]
    tokenizer = build_tokenizer(cfg.model, [p + c + r for p, c, r in plain])
    pairs, _ = encode_pairs(plain, tokenizer, max_length=cfg.data.max_length,
                            max_prompt_length=cfg.data.max_prompt_length, truncation_mode=cfg.data.truncation_mode)
    tokenizer.save_pretrained(workdir / "tokenizer")
    build_policy(cfg.model, tokenizer, SEED).save_pretrained(workdir / "init_model")
    (workdir / "pairs.json").write_text(json.dumps([[p.prompt, p.chosen, p.rejected] for p in pairs]))
    train = cfg.train
    techniques = {"precompute_reference_logps": bool(train.precompute_reference_logps),
                  "logps_chunk_size": int(train.logps_chunk_size), "share_prompt": bool(train.share_prompt),
                  "length_group_window": int(cfg.data.length_group_window) if cfg.data.length_grouped else 0}
    (workdir / "workload.json").write_text(json.dumps({**w, "techniques": techniques}))


def load_pairs(workdir: Path):
    from dpo_sweeps.data.encoding import EncodedPair

    return [EncodedPair(*p) for p in json.loads((workdir / "pairs.json").read_text())]


def pair_tokens(pair) -> int:
    return 2 * len(pair.prompt) + len(pair.chosen) + len(pair.rejected)


# ---------------------------------------------------------------------------------------------- runners
class StepClock:
    """Wall and CPU time at the end of each step."""

    def __init__(self):
        self.wall, self.cpu, self.tokens = [], [], []
        self.start_wall = time.perf_counter()

    def tick(self, tokens: int | None = None) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())
        if tokens is not None:
            self.tokens.append(tokens)


def run_ours(workdir: Path, w: dict, out: Path, extra: list[str]) -> None:
    """The real CLI in this process; only the step boundaries are observed (train_step is wrapped)."""
    import dpo_sweeps.train.trainer as trainer_module
    from dpo_sweeps.__main__ import main

    clock = StepClock()
    original = trainer_module.Trainer.train_step

    def timed_train_step(self, step):
        if not clock.wall:
            clock.start_wall = time.perf_counter()
        record = original(self, step)
        clock.tick(int(self.perf.step_tokens[-1]))
        return record

    trainer_module.Trainer.train_step = timed_train_step
    run_dir = out.with_suffix("")
    sys.argv = ["dpo_sweeps", *ours_overrides(w, extra), f"hydra.run.dir={run_dir}"]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = summary["metrics"]
    out.write_text(json.dumps({"wall": clock.wall, "cpu": clock.cpu, "tokens": clock.tokens,
                               "one_time_s": metrics.get("perf/reference_precompute_s") or 0.0,
                               "start_wall": clock.start_wall, "status": summary["status"],
                               "own_perf": {k: v for k, v in metrics.items() if k.startswith("perf/")},
                               "losses": [r["train/loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").open())
                                          if "train/loss" in r]}))


def run_trl(workdir: Path, w: dict, out: Path, precompute: bool = False) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    torch.manual_seed(SEED)
    tokenizer = AutoTokenizer.from_pretrained(workdir / "tokenizer")
    model = AutoModelForCausalLM.from_pretrained(workdir / "init_model", dtype=torch.float32)
    pairs = load_pairs(workdir)
    dataset = Dataset.from_list([{"prompt_ids": p.prompt, "chosen_ids": p.chosen, "rejected_ids": p.rejected}
                                 for p in pairs])
    clock = StepClock()
    batch_tokens: list[int] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick(batch_tokens[state.global_step - 1] if len(batch_tokens) >= state.global_step else None)

    class CountingCollator(DataCollatorForPreference):
        def torch_call(self, examples):
            batch = super().torch_call(examples)
            batch_tokens.append(int(batch["attention_mask"].sum()))
            return batch

    class PreTokenizedDPOTrainer(DPOTrainer):
        """Our tokenized pairs as they are: TRL's own tokenization would cut and merge differently."""

        one_time_s = 0.0

        def _prepare_dataset(self, dataset, *args, **kwargs):
            return dataset

        def _precompute_ref_logps(self, *args, **kwargs):  # with precompute_ref_log_probs, in __init__
            begin = time.perf_counter()
            result = super()._precompute_ref_logps(*args, **kwargs)
            PreTokenizedDPOTrainer.one_time_s += time.perf_counter() - begin
            return result

    args = DPOConfig(
        output_dir=str(out.with_suffix("")), per_device_train_batch_size=w["batch"], gradient_accumulation_steps=1,
        max_steps=w["steps"], learning_rate=LR, lr_scheduler_type="constant_with_warmup", warmup_steps=WARMUP_STEPS,
        max_grad_norm=MAX_GRAD_NORM, weight_decay=0.0, optim="adamw_torch", beta=BETA, loss_type=["sigmoid"],
        max_length=w["max_length"], seed=SEED, bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False,
        dataloader_num_workers=0, logging_steps=10**6, report_to="none", save_strategy="no", eval_strategy="no",
        disable_tqdm=True, precompute_ref_log_probs=precompute,
    )
    collator = CountingCollator(pad_token_id=tokenizer.pad_token_id, max_length=w["max_length"])
    trainer = PreTokenizedDPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                                     data_collator=collator, callbacks=[Clock()])
    one_time = PreTokenizedDPOTrainer.one_time_s
    batch_tokens.clear()
    clock.start_wall = time.perf_counter()
    trainer.train()
    out.write_text(json.dumps({"wall": clock.wall, "cpu": clock.cpu, "tokens": batch_tokens[: len(clock.wall)],
                               "one_time_s": one_time, "start_wall": clock.start_wall, "status": "completed"}))


def run_bare(workdir: Path, w: dict, out: Path) -> None:
    """The same per-step work as ours, in a plain loop over pre-collated batches."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from dpo_sweeps.data.encoding import GlobalBatchSampler, collate
    from dpo_sweeps.dpo.response_logps import batch_logps
    from dpo_sweeps.models.build import build_reference

    tech = w["techniques"]
    chunk, share = tech["logps_chunk_size"], tech["share_prompt"]
    policy = AutoModelForCausalLM.from_pretrained(workdir / "init_model", dtype=torch.float32)
    reference = build_reference(policy, torch.float32)
    pairs = load_pairs(workdir)
    pad_id = policy.config.pad_token_id
    lengths = [len(p.prompt) + len(p.chosen) + len(p.rejected) if share else p.length for p in pairs]
    sampler = GlobalBatchSampler(len(pairs), w["batch"], SEED, lengths=lengths,
                                 group_window=tech["length_group_window"])
    batches = [collate([pairs[i] for i in sampler.indices(s)], pad_id, share_prompt=share) for s in range(w["steps"])]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (WARMUP_STEPS + 1)))

    one_time = 0.0
    if tech["precompute_reference_logps"]:
        begin = time.perf_counter()
        with torch.no_grad():
            for batch in batches:
                batch["reference_logps"] = batch_logps(reference, batch, chunk)[0]
        one_time = time.perf_counter() - begin
        del reference
        reference = None

    clock = StepClock()
    policy.train()
    for batch in batches:
        logps, _ = batch_logps(policy, batch, chunk)
        if reference is None:
            ref = batch["reference_logps"]
        else:
            with torch.no_grad():
                ref = batch_logps(reference, batch, chunk)[0]
        n = logps.shape[0] // 2
        h = (logps[:n] - logps[n:]) - (ref[:n] - ref[n:])
        loss = -F.logsigmoid(BETA * h).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        clock.tick(int(batch["num_tokens"]))
    out.write_text(json.dumps({"wall": clock.wall, "cpu": clock.cpu, "tokens": clock.tokens, "one_time_s": one_time,
                               "start_wall": clock.start_wall, "status": "completed"}))


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


def spawn(kind: str, workdir: Path, out: Path, log: Path, extra: list[str], cache: Path) -> tuple[dict, int]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run", kind, "--workdir", str(workdir), "--out", str(out)]
    cmd += [f"--override={o}" for o in extra]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               DPO_SWEEPS_CACHE=str(cache), PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
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

    w = dict(SMOKE if args.smoke else FULL, data_path=str(HH))
    if args.rounds:
        w["rounds"] = args.rounds
    kinds = [k.strip() for k in args.frameworks.split(",") if k.strip()]
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
                                fresh_cache(workdir, tag))
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
