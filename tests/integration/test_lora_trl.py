"""peft=lora against TRL 1.16's DPOTrainer with the same peft_config, on the same tiny model, adapter
initialization and token ids: losses, log-probs and rewards agree step by step to REL relative.

TRL draws its adapters' initial weights from a random state of its own, so they are set to dpo-sweeps'
(the same seed and procedure as a run's build_models). Every step trains on all 8 pairs (batch 8 of 8),
so both see the same batches whatever order their samplers draw; fp32, constant learning rate, AdamW,
one rank. Ours is the real CLI (the reference's log-probs precomputed with the adapters off); TRL's runs
its reference pass with the adapters disabled at every step.

Like for like: TRL's DPOConfig defaults to `bf16=True` (bf16 autocast, on a CPU too) and to activation
checkpointing; both are turned off here, as ours runs precision=fp32 without activation checkpointing.
Left at bf16, TRL's projections compute in bf16 and its log-probs land further from the fp32 ones than
REL before anything trains (that was the rejected rows' gap once blamed on TRL's batch layout; the chosen
rows' happened to be smaller); checkpointing alone changes no number. Our speed techniques change
nothing at this bar: the prefix-shared row per pair (`train.share_prompt`: rejected tokens after the
chosen ones behind a 4-D mask, their positions restarting after the prompt) and the chunked LM head over
response positions only (`train.logps_chunk_size`) score the same log-probs as full logits on one row
per sequence to fp32 rounding (the order of the sums and of the attention's masked reductions, far
below REL); so both of ours, the training default and the plain `share_prompt=false logps_chunk_size=0`,
are held to the same REL.
"""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from support import REPO, run_cli

REL = 1e-5
STEPS, PAIRS, SEED, LR, BETA = 5, 8, 0, 1e-2, 0.1
OURS = ["model=tiny_llama", "peft=lora", "peft.r=4", "peft.alpha=8", f"train.max_steps={STEPS}",
        f"train.batch_size={PAIRS}", f"train.micro_batch_size={PAIRS}", f"data.num_train_pairs={PAIRS}",
        "data.num_eval_pairs=8", "train.eval_every=0", "train.warmup_steps=0", f"train.lr={LR}",
        "train.max_grad_norm=10", f"train.seed={SEED}", f"loss.beta={BETA}", "train.save_model=false",
        "perf.warmup_steps=1"]


def _config(overrides: list[str]):
    from dpo_sweeps import api
    from dpo_sweeps.config.schema import Config

    values = OmegaConf.to_container(api.compose(overrides), resolve=False)
    values.pop("hydra", None)
    return Config.of(OmegaConf.to_container(OmegaConf.create(values), resolve=True))


def _trl_records(tmp_path) -> list[dict]:
    """TRL's per-step logs, its adapters started from the weights dpo-sweeps initializes them with."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from dpo_sweeps.models.adapters import add_adapters, lora_config
    from dpo_sweeps.models.build import build_policy
    from dpo_sweeps.parallel.rank_env import RankEnv
    from dpo_sweeps.train.setup import build_data

    cfg = _config(OURS)
    data = build_data(cfg, REPO, RankEnv(0, 1, 0, 1, "127.0.0.1", 0))
    peft_config = lora_config(build_policy(cfg.model, data.tokenizer, SEED), cfg.peft, cfg.model.block_name)
    ours = build_policy(cfg.model, data.tokenizer, SEED)
    torch.manual_seed(SEED)  # as build_models seeds the adapters, once the model is built
    ours = add_adapters(ours, cfg.peft, cfg.model.block_name)

    class PreTokenized(DPOTrainer):
        def _prepare_dataset(self, dataset, *args, **kwargs):
            return dataset

    dataset = Dataset.from_list([{"prompt_ids": p.prompt, "chosen_ids": p.chosen, "rejected_ids": p.rejected}
                                 for p in data.train_pairs])
    args = DPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=PAIRS, max_steps=STEPS,
                     learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=10.0, bf16=False,
                     activation_checkpointing=False,
                     weight_decay=0.0, optim="adamw_torch", beta=BETA, loss_type=["sigmoid"], max_length=None,
                     seed=SEED, use_cpu=True, logging_steps=1, report_to="none", save_strategy="no",
                     eval_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    base = build_policy(cfg.model, data.tokenizer, SEED)
    torch.manual_seed(SEED)
    trainer = PreTokenized(model=base, args=args, train_dataset=dataset, processing_class=data.tokenizer,
                           peft_config=peft_config)
    # TRL draws its adapters' initial weights from a random state of its own: give it ours.
    trl_params = dict(trainer.model.named_parameters())
    with torch.no_grad():
        for name, param in ours.named_parameters():
            if ".lora_" in name:
                trl_params["base_model.model." + name].copy_(param)
    assert all(p.requires_grad == (".lora_" in n) for n, p in trl_params.items())
    trainer.train()
    return [r for r in trainer.state.log_history if "loss" in r and "rewards/chosen" in r]


@pytest.fixture(scope="module")
def trl_steps(tmp_path_factory) -> list[dict]:
    pytest.importorskip("trl")
    return _trl_records(tmp_path_factory.mktemp("trl"))


@pytest.mark.parametrize("techniques", [[], ["train.share_prompt=false", "train.logps_chunk_size=0"]],
                         ids=["training default", "full logits, one row per sequence"])
def test_lora_losses_and_rewards_equal_trls_with_the_same_peft_config(tmp_path, trl_steps, techniques):
    ours = run_cli(tmp_path / "ours", *OURS, *techniques)
    assert ours.returncode == 0, ours.stderr[-2000:]
    ours_steps = [r for r in ours.records if "train/loss" in r]
    assert len(trl_steps) == len(ours_steps) == STEPS, json.dumps(trl_steps)[:2000]
    for step, (a, b) in enumerate(zip(ours_steps, trl_steps, strict=True), 1):
        for ours_key, trl_key in (("train/loss", "loss"), ("train/logps/chosen", "logps/chosen"),
                                  ("train/logps/rejected", "logps/rejected")):
            assert a[ours_key] == pytest.approx(b[trl_key], rel=REL), (step, ours_key, a, b)
        # A reward is beta x a difference of two fp32 log-probs of ~80 nats: REL of the reward itself is a few
        # fp32 roundings of those sums, so the like-for-like settings above matter (bf16 misses it by far).
        for side in ("chosen", "rejected"):
            assert a[f"train/rewards/{side}"] == pytest.approx(b[f"rewards/{side}"], rel=REL), (step, side, a, b)
