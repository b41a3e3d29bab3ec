"""Each loss against a value worked by hand from its paper's formula; the loss configs and their checks."""

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dpo_sweeps.dpo.losses import LOSSES, NAMES, loss_config, loss_keys, uses_reference
from dpo_sweeps.dpo.losses.pairwise import PairLogps, preference_loss
from dpo_sweeps.dpo.token_logps import labelled_token_logps, length_desensitized_sums
from dpo_sweeps.errors import InvalidConfig

CONF = Path(__file__).resolve().parents[2] / "conf" / "loss"

# One pair: policy log-probs (chosen, rejected) = (-10, -12) over 4 and 2 tokens; reference (-11, -11).
# Log-ratios r_w = 1, r_l = -1, so d = 2; per-token means -2.5 and -6; length-normalised d = 1/4 + 1/2.
ONE = PairLogps(torch.tensor([-10.0]), torch.tensor([-12.0]), torch.tensor([-11.0]), torch.tensor([-11.0]),
                torch.tensor([4]), torch.tensor([2]), torch.tensor([-10.0]))


def sig(x):
    return 1 / (1 + math.exp(-x))


def logsig(x):
    return math.log(sig(x))


def config(name, **overrides):
    """The typed, checked `loss` of conf/loss/NAME.yaml with `overrides`, as a rank reads it."""
    loss = loss_config({**OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml")), **overrides})
    loss.check()
    return loss


def loss_of(name, x=ONE, **overrides):
    return preference_loss(config(name, **overrides), x)


# (loss, overrides, hand value of the loss on ONE)
HAND = [
    ("sigmoid", {"beta": 0.1}, -logsig(0.2)),  # 0.598139
    ("dpo", {"beta": 0.5, "label_smoothing": 0.2}, -logsig(1.0) * 0.8 - logsig(-1.0) * 0.2),
    ("hinge", {"beta": 0.1}, 1 - 0.2),
    ("ipo", {"beta": 0.1}, (2 - 5) ** 2),  # summed log-ratios: the reference implementation's IPO
    ("ipo", {"beta": 0.1, "length_normalized": True}, (0.75 - 5) ** 2),  # TRL's
    ("exo_pair", {"beta": 0.1, "label_smoothing": 1e-3},
     sig(0.2) * (logsig(0.2) - math.log(1 - 1e-3)) + sig(-0.2) * (logsig(-0.2) - math.log(1e-3))),
    ("nca_pair", {"beta": 0.1}, -logsig(0.1) - 0.5 * logsig(-0.1) - 0.5 * logsig(0.1)),
    ("robust", {"beta": 0.1, "label_smoothing": 0.1}, (-0.9 * logsig(0.2) + 0.1 * logsig(-0.2)) / 0.8),
    ("bco_pair", {"beta": 0.1}, -2 * logsig(0.1)),
    ("sppo_hard", {"beta": 0.1}, (1 - 5) ** 2 + (-1 + 5) ** 2),
    ("apo_zero", {"beta": 0.1}, 1 - sig(0.1) + sig(-0.1)),
    ("apo_down", {"beta": 0.1}, sig(0.1) + 1 - sig(0.2)),
    ("discopop", {"beta": 0.1, "discopop_tau": 0.05},
     (1 - sig(0.2 / 0.05)) * -logsig(0.2) + sig(0.2 / 0.05) * math.exp(-0.2)),
    ("sigmoid_norm", {"beta": 0.1}, -logsig(0.1 * 0.75)),
    ("sft", {}, 10 / 4),
    ("simpo", {"beta": 2.0, "gamma": 0.5}, -logsig(2.0 * (-2.5 + 6) - 0.5)),
    ("orpo", {"beta": 0.1},
     2.5 - 0.1 * logsig((-2.5 + 6) - (math.log(1 - math.exp(-2.5)) - math.log(1 - math.exp(-6))))),
    ("rso", {"beta": 0.1}, 1 - 0.2),
    ("rpo", {"beta": 0.1, "sft_weight": 1.0}, -logsig(0.2) + 10 / 4),
    # f-DPO scores s = f'(pi/ref): js log 2 + log sigmoid(r), whose difference at r = +-1 is exactly 1.
    ("f_dpo", {"beta": 0.1, "f_divergence": "js_divergence"}, -logsig(0.1)),
    ("f_dpo", {"beta": 0.1, "f_divergence": "forward_kl"}, -logsig(0.1 * (math.e - 1 / math.e))),
    ("f_dpo", {"beta": 0.1, "f_divergence": "alpha_divergence", "f_alpha_divergence_coef": 0.5},
     -logsig(0.1 * 2 * (math.exp(0.5) - math.exp(-0.5)))),
    ("mix", {"beta": 0.1}, 0.8 * -logsig(0.2) + 0.2 * -2 * logsig(0.1) + 10 / 4),  # MPO's 0.8 DPO + 0.2 BCO + SFT
]


@pytest.mark.parametrize("name,overrides,expected", HAND, ids=[f"{h[0]}-{i}" for i, h in enumerate(HAND)])
def test_loss_matches_the_value_worked_by_hand(name, overrides, expected):
    assert loss_of(name, **overrides).losses.item() == pytest.approx(expected, rel=1e-6)


def test_rewards_are_beta_log_ratios_and_for_simpo_and_orpo_beta_mean_log_probs():
    dpo = loss_of("sigmoid", beta=0.1)
    assert (dpo.chosen_rewards.item(), dpo.rejected_rewards.item()) == pytest.approx((0.1, -0.1))
    simpo = loss_of("simpo", beta=2.0)
    assert (simpo.chosen_rewards.item(), simpo.rejected_rewards.item()) == pytest.approx((-5.0, -12.0))
    assert simpo.metrics["simpo/margin_minus_gamma"].item() == pytest.approx(2.0 * 3.5 - 0.5)
    orpo = loss_of("orpo", beta=0.1)
    assert orpo.metrics["orpo/nll_loss"].item() == pytest.approx(2.5)
    assert orpo.metrics["orpo/log_odds_ratio"].item() == pytest.approx(
        logsig(orpo.metrics["orpo/log_odds_chosen"].item()))


def test_aot_compares_sorted_margins_across_the_micro_batch():
    # Policy margins (pi_w - pi_l) [2, -1], reference margins [0, 3]: sorted [-1, 2] - [0, 3] = [-1, -1].
    x = PairLogps(torch.tensor([-10.0, -13.0]), torch.tensor([-12.0, -12.0]), torch.tensor([-11.0, -9.0]),
                  torch.tensor([-11.0, -12.0]), torch.tensor([1, 1]), torch.tensor([1, 1]), torch.tensor([-10.0, -13.0]))
    assert loss_of("aot", x, beta=0.1).losses.tolist() == pytest.approx([-logsig(-0.1)] * 2)
    # Unpaired: r_w = [1, -4], r_l = [-1, 0]; sorted [-4, 1] - [-1, 0] = [-3, 1].
    assert loss_of("aot_unpaired", x, beta=0.1).losses.tolist() == pytest.approx([-logsig(-0.3), -logsig(0.1)])


def test_sft_nll_average_sequence_weighs_pairs_equally_and_batch_weighs_tokens():
    x = PairLogps(torch.tensor([-6.0, -3.0]), torch.tensor([-1.0, -1.0]), None, None, torch.tensor([3, 1]),
                  torch.tensor([1, 1]), torch.tensor([-6.0, -3.0]))
    assert loss_of("sft", x).losses.tolist() == [2.0, 3.0]
    assert loss_of("sft", x, nll_average="batch").losses.mean().item() == pytest.approx(9 / 4)  # TRL's token mean


def test_ld_dpo_weighs_tokens_past_the_shorter_response_by_alpha():
    # Chosen tokens -1 -2 -3 -4 (sequence 0), rejected -5 -6 (sequence 1), interleaved as a shared row holds them.
    values = torch.tensor([-1.0, -5.0, -2.0, -6.0, -3.0, -4.0])
    sequences = torch.tensor([0, 1, 0, 1, 0, 0])
    sums = length_desensitized_sums(values, sequences, torch.tensor([4, 2]), alpha=0.5)
    assert sums.tolist() == [-1 - 2 + 0.5 * (-3 - 4), -11.0]
    assert length_desensitized_sums(values, sequences, torch.tensor([4, 2]), alpha=1.0).tolist() == [-10.0, -11.0]


def test_reference_free_uses_a_uniform_reference():
    x = PairLogps(ONE.chosen, ONE.rejected, None, None, ONE.chosen_tokens, ONE.rejected_tokens, ONE.chosen)
    out = loss_of("sigmoid", x, beta=0.1, reference_free=True)
    assert out.losses.item() == pytest.approx(-logsig(0.2))
    assert out.chosen_rewards.item() == pytest.approx(-1.0)  # beta * policy log-prob


@pytest.mark.parametrize("beta", [0.01, 0.1, 0.5])
def test_policy_equal_to_reference_gives_ln2_for_dpo_and_inverse_two_beta_squared_for_ipo(beta):
    logps, other, n = torch.tensor([-5.0, -40.0, -300.0]), torch.tensor([-7.0, -20.0, -301.0]), torch.tensor([1, 1, 1])
    x = PairLogps(logps, other, logps, other, n, n, logps)
    assert torch.allclose(loss_of("sigmoid", x, beta=beta).losses, torch.full((3,), math.log(2)))
    assert torch.allclose(loss_of("ipo", x, beta=beta).losses, torch.full((3,), (1 / (2 * beta)) ** 2))


def test_labelled_token_logps_score_only_labelled_tokens_with_the_shift():
    # Vocabulary of 2; logits favour token 1 everywhere: log p(1) = log(e/(1+e)), log p(0) = log(1/(1+e)).
    logits = torch.tensor([[[0.0, 1.0]] * 4])
    labels = torch.tensor([[-100, -100, 1, 0]])  # prompt of 2 tokens, response "1 0"
    values, rows = labelled_token_logps(logits, labels)
    assert values.tolist() == pytest.approx([math.log(math.e / (1 + math.e)), math.log(1 / (1 + math.e))])
    assert rows.tolist() == [0, 0]


# ------------------------------------------------------------------ configs
def test_every_loss_has_a_conf_file_with_exactly_its_keys_that_passes_the_checks():
    files = {p.stem for p in CONF.glob("*.yaml")}
    assert files == set(NAMES)
    for name in NAMES:
        text = (CONF / f"{name}.yaml").read_text()
        keys = tuple(OmegaConf.load(CONF / f"{name}.yaml"))
        loss = config(name)
        assert loss.name == name and type(loss).__name__.lower().startswith(name.replace("_", ""))
        assert keys == loss_keys(loss), name  # the registry's keys, in its order
        assert text.startswith("# ") and f"python -m dpo_sweeps loss={name}" in text, name


def test_reference_free_losses_need_no_reference():
    for name in ("sft", "simpo", "orpo"):
        assert not uses_reference(config(name))
    assert uses_reference(config("sigmoid"))
    assert not uses_reference(config("sigmoid", reference_free=True))
    assert not uses_reference(config("mix", terms=[{"name": "sft", "weight": 1.0}], reference_free=False))


@pytest.mark.parametrize("name,overrides,setting", [
    ("sigmoid", {"beta": 0.0}, "loss.beta"),
    ("dpo", {"label_smoothing": 0.5}, "loss.label_smoothing"),
    ("exo_pair", {"label_smoothing": 0.0}, "loss.label_smoothing"),  # EXO needs eps > 0
    ("robust", {"label_smoothing": 0.5}, "loss.label_smoothing"),
    ("simpo", {"gamma": -1.0}, "loss.gamma"),
    ("ld_dpo", {"ld_alpha": 1.5}, "loss.ld_alpha"),
    ("f_dpo", {"f_divergence": "kl"}, "loss.f_divergence"),
    ("sft", {"nll_average": "token"}, "loss.nll_average"),
    ("sigmoid", {"gamma": 0.5}, "loss.gamma"),  # SimPO's margin is not sigmoid's
    ("simpo", {"reference_free": True}, "loss.reference_free"),  # no reference to leave out
    ("nca_pair", {"f_divergence": "js_divergence"}, "loss.f_divergence"),  # no f-divergence form
    ("mix", {"terms": [{"name": "simpo", "weight": 1.0}]}, r"loss.terms\[0\].name"),
    ("mix", {"terms": [{"name": "robust", "weight": 1.0}]}, "loss.label_smoothing"),  # robust's eps is needed
    ("mix", {"f_divergence": "js_divergence"}, "loss.f_divergence"),  # bco_pair has no f-divergence form
    ("mix", {"terms": []}, "loss.terms"),
])
def test_bad_loss_settings_name_the_setting(name, overrides, setting):
    with pytest.raises(InvalidConfig, match=setting):
        config(name, **overrides)


def test_an_unknown_loss_lists_the_known_ones():
    with pytest.raises(InvalidConfig, match="loss.name.*sigmoid, hinge") as info:
        loss_config({"name": "kto", "beta": 0.1}).check()
    assert all(name in str(info.value) for name in LOSSES)


def test_the_docs_table_lists_every_loss_with_its_reference_need_and_trl_name():
    page = (CONF.parent.parent / "docs" / "losses.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    for name, spec in LOSSES.items():
        cells = [c.strip() for c in rows[name].split("|")[1:-1]]
        assert cells[2] == ("yes" if spec.uses_reference else "**no**"), name
        assert cells[4] == spec.trl_name, name
        assert all(f"`{key}`" in cells[3] for key in spec.own), name
    assert "mix" in rows
