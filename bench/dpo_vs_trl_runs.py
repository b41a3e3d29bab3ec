"""The three measured runs of bench/dpo_vs_trl.py (ours, TRL, bare) and the workload they share.

Each runs in its own process (`dpo_vs_trl.py --run KIND`) and writes its step times to `--out`;
the driver, dpo_vs_trl.py, alternates them and reports.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere, without installing
HH = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"

FULL = dict(pairs=256, steps=32, warmup=3, max_length=256, max_prompt_length=128, batch=8, rounds=3)
# SmolLM2-135M is ~30x the GPT-2 toy's parameters: one epoch of 96 pairs keeps 3 rounds of 4 frameworks short.
SMOLLM2 = dict(pairs=96, steps=12, warmup=2, max_length=128, max_prompt_length=64, batch=8, rounds=3)
SMOKE = dict(pairs=16, steps=4, warmup=1, max_length=64, max_prompt_length=32, batch=4, rounds=1)
BETA, LR, WARMUP_STEPS, MAX_GRAD_NORM, SEED = 0.1, 3e-3, 10, 10.0, 0


# ---------------------------------------------------------------------------------------------- workload
def ours_overrides(w: dict, extra: list[str] = ()) -> list[str]:
    return [f"model={w['model']}", "data=hh", f"data.path={w['data_path']}", f"data.max_pairs={w['pairs']}",
            f"data.max_length={w['max_length']}", f"data.max_prompt_length={w['max_prompt_length']}",
            f"train.batch_size={w['batch']}", f"train.micro_batch_size={w['batch']}", f"loss.beta={BETA}",
            f"train.lr={LR}", f"train.warmup_steps={WARMUP_STEPS}", f"train.max_grad_norm={MAX_GRAD_NORM}",
            f"train.seed={SEED}", f"train.max_steps={w['steps']}", f"perf.warmup_steps={w['warmup']}",
            "train.eval_every=0", "train.eval_max_pairs=8", "train.save_model=false", "checkpoint.every_steps=0",
            "tracking.wandb.mode=disabled", "train.progress_bar=false",
            # the malloc this process was started with (bench/dpo_vs_trl.py --allocator): it trains here
            f"resources.cpu_allocator={w.get('allocator', 'glibc')}",
            *(["peft=lora", f"peft.r={w['peft_r']}", f"peft.alpha={2 * w['peft_r']}"] if w.get("peft_r") else []),
            *extra]


def trl_peft_config(w: dict, model):
    """--peft lora: TRL's peft_config with our LoRA settings (peft=lora's default targets: every linear
    layer of the blocks), so both train the same adapters."""
    if not w.get("peft_r"):
        return None
    from peft import LoraConfig

    from dpo_sweeps.models.adapters import lora_config

    config = compose(ours_overrides(w))
    ours = lora_config(model, config.peft, config.model.block_name)
    return LoraConfig(r=ours.r, lora_alpha=ours.lora_alpha, lora_dropout=ours.lora_dropout,
                      target_modules=sorted(ours.target_modules), fan_in_fan_out=ours.fan_in_fan_out,
                      bias="none", task_type="CAUSAL_LM")


def compose(overrides: list[str]):
    """The typed config a run of these overrides trains with (Config.of of the resolved composition)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from dpo_sweeps.config.schema import Config

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return Config.of(OmegaConf.to_container(hydra_compose(config_name="config", overrides=overrides), resolve=True))


def prepare(workdir: Path, w: dict) -> None:
    """Tokenizer folder, initial weights and tokenized pairs, through dpo-sweeps' own data path."""
    from dpo_sweeps.data.encoding import chat_format, encode_pairs, render_pair
    from dpo_sweeps.data.sources import load_preference_rows
    from dpo_sweeps.models.build import build_policy, build_tokenizer

    cfg = compose(ours_overrides(w))
    rows = load_preference_rows(cfg.data, REPO)
    plain = [render_pair(r) for r in rows.train]
    tokenizer = build_tokenizer(cfg.model, [p + c + r for p, c, r in plain])
    chat = chat_format(tokenizer, cfg.data.chat_template)  # a pretrained model's template, as a run renders
    texts = [render_pair(r, chat, hh_dialogue=True) for r in rows.train] if chat else plain
    pairs, _ = encode_pairs(texts, tokenizer, max_length=cfg.data.max_length,
                            max_prompt_length=cfg.data.max_prompt_length, truncation_mode=cfg.data.truncation_mode,
                            end_of_turn=chat.end_of_turn if chat else None)
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
                                     data_collator=collator, callbacks=[Clock()],
                                     peft_config=trl_peft_config(w, model))
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

    from dpo_sweeps.data.collate import collate
    from dpo_sweeps.data.encoding import GlobalBatchSampler
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
