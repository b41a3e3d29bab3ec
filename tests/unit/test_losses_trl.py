"""Every loss against TRL 1.16's own code, on the same tiny model, reference and token sequences.

TRL's DPOTrainer is built once for the module; each case sets the attributes its `_compute_loss`
reads (loss_types, loss_weights, beta, label_smoothing, f_divergence_type, ld_alpha, discopop_tau)
and runs its real loss path, the fused LM head included, on a batch from TRL's own collator. Ours
scores the same pairs through response_logps (prefix-shared rows, chunked LM head: the training
default) and preference_loss. SimPO and ORPO are not DPOTrainer losses: they run TRL's CPOTrainer /
ORPOTrainer loss methods and log-prob function (trl.experimental) on the same model's logits.

The largest relative differences measured are printed at the end (pytest -s) and written to the
file named by DPO_SWEEPS_LOSS_DIFFS, when set.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.data.collate import collate
from dpo_sweeps.data.encoding import EncodedPair
from dpo_sweeps.dpo.losses import ld_alpha_of, loss_config
from dpo_sweeps.dpo.losses.pairwise import PairLogps, preference_loss
from dpo_sweeps.dpo.response_logps import response_logps
from dpo_sweeps.models.tokenizers import byte_tokenizer

REL = 1e-5
BETA = 0.5
# Prompts and responses of different lengths: chosen longer, shorter and as long as rejected.
PAIRS = [
    EncodedPair(prompt=[72, 101, 108, 108], chosen=[111, 32, 119, 111, 114, 108, 100], rejected=[33, 63]),
    EncodedPair(prompt=[84, 104], chosen=[101, 32], rejected=[97, 98, 99, 100, 101, 102]),
    EncodedPair(prompt=[87, 104, 121, 32, 110, 111], chosen=[116, 32, 121, 101, 115], rejected=[110, 111, 32, 33, 33]),
    EncodedPair(prompt=[65], chosen=[98], rejected=[99, 100, 101]),
]
# case -> largest relative difference of the loss, and of the chosen and rejected rewards
DIFFS: dict[str, tuple[float, float]] = {}


def _tiny_gpt2(vocab: int, seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_layer=1, n_embd=32, n_head=2, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():  # a wider spread of log-probs than the initial 0.02-scale weights give
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    return model.eval()


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The policy, a different reference, TRL's trainer on them, and both sides' inputs."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    tokenizer = byte_tokenizer()
    policy, reference = _tiny_gpt2(len(tokenizer), 0), _tiny_gpt2(len(tokenizer), 1)
    rows = [{"prompt_ids": p.prompt, "chosen_ids": p.chosen, "rejected_ids": p.rejected} for p in PAIRS]

    class PreTokenized(DPOTrainer):
        def _prepare_dataset(self, dataset, *args, **kwargs):
            return dataset

    args = DPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=len(PAIRS),
                     report_to="none", use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True,
                     max_length=None, beta=BETA, loss_type=["sigmoid"])
    trainer = PreTokenized(model=policy, ref_model=reference, args=args, train_dataset=Dataset.from_list(rows),
                           processing_class=tokenizer)
    trl_inputs = DataCollatorForPreference(pad_token_id=tokenizer.pad_token_id)(rows)
    yield SimpleNamespace(trainer=trainer, policy=policy, reference=reference, trl_inputs=trl_inputs,
                          ours=collate(PAIRS, tokenizer.pad_token_id, share_prompt=True),
                          full=collate(PAIRS, tokenizer.pad_token_id))
    _report()


def _report():
    if not DIFFS:
        return
    width = max(map(len, DIFFS))
    print(f"\nlargest relative difference to TRL\n  {'case':<{width}}  loss      rewards")
    for name, (loss, rewards) in DIFFS.items():
        print(f"  {name:<{width}}  {loss:.2e}  {rewards:.2e}")
    if os.environ.get("DPO_SWEEPS_LOSS_DIFFS"):
        with open(os.environ["DPO_SWEEPS_LOSS_DIFFS"], "w") as f:
            json.dump(DIFFS, f, indent=1)


def _loss_config(name: str, **overrides):
    loss = loss_config({**OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "loss" / f"{name}.yaml")), **overrides})
    loss.check()  # every case is a config validate.py accepts
    return loss


def ours(bench, cfg, uniform_reference: bool = False, full_logits: bool = False):
    """Mean loss and mean rewards as the trainer computes them (trainer._pair_losses)."""
    batch, chunk = (bench.full, 0) if full_logits else (bench.ours, 7)
    ld_alpha = ld_alpha_of(cfg)
    with torch.no_grad():
        policy = response_logps(bench.policy, batch, chunk_size=chunk)
        reference = None if uniform_reference else response_logps(bench.reference, batch, chunk).weighted(ld_alpha)
        out = preference_loss(cfg, PairLogps.split(policy.weighted(ld_alpha), policy.counts, policy.sums, reference))
    return out.losses.mean().item(), out.chosen_rewards.mean().item(), out.rejected_rewards.mean().item()


def theirs(bench, loss_type, weights=None, *, label_smoothing=0.0, f_divergence="reverse_kl", f_alpha=0.5,
           ld_alpha=None, discopop_tau=0.05, uniform_reference=False):
    """TRL DPOTrainer._compute_loss on the same batch: its loss and logged mean rewards."""
    t = bench.trainer
    t.loss_types, t.loss_weights = list(loss_type), list(weights or [1.0] * len(loss_type))
    t.beta, t.label_smoothing, t.ld_alpha = BETA, label_smoothing, ld_alpha
    t.f_divergence_type, t.f_alpha_divergence_coef, t.args.discopop_tau = f_divergence, f_alpha, discopop_tau
    inputs = dict(bench.trl_inputs)
    t.precompute_ref_logps = uniform_reference
    if uniform_reference:  # TRL reads precomputed reference log-probs from the batch: give it zeros
        inputs["ref_chosen_logps"] = inputs["ref_rejected_logps"] = torch.zeros(len(PAIRS))
    t._metrics["eval"].clear()  # the models are in eval mode: TRL logs under "eval"
    with torch.no_grad():
        loss = t.compute_loss(t.model, inputs).item()
    m = t._metrics["eval"]
    return loss, m["rewards/chosen"][-1], m["rewards/rejected"][-1]


def assert_equal(case: str, ours_values, trl_values) -> None:
    """(loss, chosen reward, rejected reward, ...) equal to 1e-5 relative; the differences are recorded.
    A value near 0 (ORPO's log-odds of a nearly even pair) is a difference of two fp32 numbers: there, 1e-6
    absolute, a few fp32 roundings of the terms it is taken from."""
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours_values, trl_values)]
    DIFFS[case] = (diffs[0], max(diffs[1:]))
    assert ours_values == pytest.approx(trl_values, rel=REL, abs=1e-6), case


# (case, our loss=, our overrides, TRL loss_type list, TRL weights, TRL settings)
CASES = [
    ("sigmoid", "sigmoid", {}, ["sigmoid"], None, {}),
    ("dpo (label_smoothing 0)", "dpo", {}, ["sigmoid"], None, {}),
    ("hinge", "hinge", {}, ["hinge"], None, {}),
    ("ipo (length_normalized)", "ipo", {"length_normalized": True}, ["ipo"], None, {}),
    ("exo_pair", "exo_pair", {}, ["exo_pair"], None, {"label_smoothing": 1e-3}),
    ("nca_pair", "nca_pair", {}, ["nca_pair"], None, {}),
    ("robust", "robust", {}, ["robust"], None, {"label_smoothing": 0.1}),
    ("bco_pair", "bco_pair", {}, ["bco_pair"], None, {}),
    ("sppo_hard", "sppo_hard", {}, ["sppo_hard"], None, {}),
    ("aot", "aot", {"label_smoothing": 0.1}, ["aot"], None, {"label_smoothing": 0.1}),
    ("aot_unpaired", "aot_unpaired", {}, ["aot_unpaired"], None, {}),
    ("apo_zero", "apo_zero", {}, ["apo_zero"], None, {}),
    ("apo_down", "apo_down", {}, ["apo_down"], None, {}),
    ("discopop", "discopop", {}, ["discopop"], None, {"discopop_tau": 0.05}),
    ("sigmoid_norm", "sigmoid_norm", {}, ["sigmoid_norm"], None, {}),
    ("rso", "rso", {}, ["hinge"], None, {}),
    ("rpo (sft_weight 0.5, nll_average batch)", "rpo", {"sft_weight": 0.5, "nll_average": "batch"},
     ["sigmoid", "sft"], [1.0, 0.5], {}),
    ("f_dpo forward_kl", "f_dpo", {"f_divergence": "forward_kl"}, ["sigmoid"], None, {"f_divergence": "forward_kl"}),
    ("f_dpo js_divergence", "f_dpo", {}, ["sigmoid"], None, {"f_divergence": "js_divergence"}),
    ("f_dpo alpha_divergence 0.5", "f_dpo", {"f_divergence": "alpha_divergence"}, ["sigmoid"], None,
     {"f_divergence": "alpha_divergence", "f_alpha": 0.5}),
    ("hinge js_divergence", "hinge", {"f_divergence": "js_divergence"}, ["hinge"], None,
     {"f_divergence": "js_divergence"}),
    ("ld_dpo (ld_alpha 0.5)", "ld_dpo", {}, ["sigmoid"], None, {"ld_alpha": 0.5}),
    ("ipo ld_alpha 0.3 (length_normalized)", "ipo", {"ld_alpha": 0.3, "length_normalized": True}, ["ipo"], None,
     {"ld_alpha": 0.3}),
    ("mix (MPO: 0.8 sigmoid, 0.2 bco_pair, 1 sft)", "mix", {"nll_average": "batch"}, ["sigmoid", "bco_pair", "sft"],
     [0.8, 0.2, 1.0], {}),
    ("mix robust + aot", "mix", {"terms": [{"name": "robust", "weight": 0.7}, {"name": "aot", "weight": 0.3}],
                                 "label_smoothing": 0.2}, ["robust", "aot"], [0.7, 0.3], {"label_smoothing": 0.2}),
]


@pytest.mark.parametrize("case,name,overrides,loss_type,weights,settings", CASES, ids=[c[0] for c in CASES])
def test_loss_and_rewards_equal_trl(bench, case, name, overrides, loss_type, weights, settings):
    cfg = _loss_config(name, beta=BETA, **overrides)
    assert_equal(case, ours(bench, cfg), theirs(bench, loss_type, weights, **settings))


@pytest.mark.parametrize("case,name,overrides,loss_type,weights,settings",
                         [c for c in CASES if c[1] in ("sigmoid", "ld_dpo", "mix")], ids=lambda v: str(v)[:20])
def test_the_full_logits_path_gives_the_same_losses(bench, case, name, overrides, loss_type, weights, settings):
    """train.logps_chunk_size=0 (full [2B, L, V] logits, no prefix sharing), LD-DPO's weighting included."""
    cfg = _loss_config(name, beta=BETA, **overrides)
    assert_equal(f"{case}, full logits", ours(bench, cfg, full_logits=True),
                 theirs(bench, loss_type, weights, **settings))


@pytest.mark.parametrize("name,overrides,loss_type", [
    ("sft", {"nll_average": "batch"}, ["sft"]),
    ("sigmoid", {"reference_free": True}, ["sigmoid"]),
    ("ipo", {"reference_free": True, "length_normalized": True}, ["ipo"]),
])
def test_reference_free_losses_equal_trl_with_a_uniform_reference(bench, name, overrides, loss_type):
    """No reference model on our side; TRL is given precomputed reference log-probs of 0."""
    cfg = _loss_config(name, beta=BETA, **overrides)
    assert_equal(f"{name} {overrides}", ours(bench, cfg, uniform_reference=True),
                 theirs(bench, loss_type, uniform_reference=True))


def _trl_mean_logps(bench, trainer_class):
    """TRL's own (static) get_batch_logps on the policy's logits, per-token means: what CPO and ORPO score."""
    full = bench.full
    with torch.no_grad():
        logits = bench.policy(input_ids=full["input_ids"], attention_mask=full["attention_mask"]).logits
    logps = trainer_class.get_batch_logps(logits, full["labels"], average_log_prob=True)
    return logps[: len(PAIRS)], logps[len(PAIRS):]


def test_simpo_equals_trl_cpo_trainer_simpo_loss(bench):
    from trl.experimental.cpo import CPOTrainer

    cfg = _loss_config("simpo", beta=2.0, gamma=0.7)
    chosen, rejected = _trl_mean_logps(bench, CPOTrainer)
    fake_self = SimpleNamespace(alpha=0.0, loss_type="simpo", simpo_gamma=0.7, beta=2.0, label_smoothing=0.0,
                                accelerator=SimpleNamespace(device=torch.device("cpu")))
    losses, chosen_rewards, rejected_rewards = CPOTrainer.cpo_loss(fake_self, chosen, rejected)
    assert_equal("simpo", ours(bench, cfg, uniform_reference=True),
                 (losses.mean().item(), chosen_rewards.mean().item(), rejected_rewards.mean().item()))


def test_orpo_equals_trl_orpo_trainer_odds_ratio_loss(bench):
    """ORPO's odds-ratio term, rewards and log-odds against ORPOTrainer.odds_ratio_loss; its NLL against
    DPOTrainer's sft (TRL's ORPOTrainer takes the NLL over prompt tokens too: ours, as the paper's L_SFT
    on y_w, over the response only)."""
    from trl.experimental.orpo import ORPOTrainer

    cfg = _loss_config("orpo", beta=0.25, nll_average="batch")
    chosen, rejected = _trl_mean_logps(bench, ORPOTrainer)
    fake_self = SimpleNamespace(beta=0.25, accelerator=SimpleNamespace(device=torch.device("cpu")))
    losses, chosen_rewards, rejected_rewards, log_odds_ratio, log_odds_chosen = ORPOTrainer.odds_ratio_loss(
        fake_self, chosen, rejected)
    trl_nll = theirs(bench, ["sft"], uniform_reference=True)[0]

    with torch.no_grad():
        policy = response_logps(bench.policy, bench.ours, chunk_size=7)
        out = preference_loss(cfg, PairLogps.split(policy.sums, policy.counts, policy.sums, None))
    mine = [out.losses.mean().item(), out.chosen_rewards.mean().item(), out.rejected_rewards.mean().item(),
            out.metrics["orpo/log_odds_ratio"].mean().item(), out.metrics["orpo/log_odds_chosen"].mean().item()]
    trl_values = [trl_nll - losses.mean().item(), chosen_rewards.mean().item(), rejected_rewards.mean().item(),
                  log_odds_ratio.item(), log_odds_chosen.item()]
    assert_equal("orpo", mine, trl_values)
