"""Preference losses against values computed by hand from the papers' formulas."""

import math

import pytest
import torch

from dpo_sweeps.errors import InvalidConfig
from dpo_sweeps.losses import check_loss_config, preference_loss, sequence_logps, sft_loss

# One pair: policy log-probs (chosen, rejected) = (-10, -12); reference = (-11, -11).
# h = (-10 - -12) - (-11 - -11) = 2.
PI_C, PI_R, REF_C, REF_R = torch.tensor([-10.0]), torch.tensor([-12.0]), torch.tensor([-11.0]), torch.tensor([-11.0])


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_dpo_sigmoid_loss_matches_hand_value():
    out = preference_loss(PI_C, PI_R, REF_C, REF_R, name="dpo", beta=0.1)
    assert out.losses.item() == pytest.approx(-math.log(sigmoid(0.2)), rel=1e-6)  # 0.598139
    assert out.chosen_rewards.item() == pytest.approx(0.1)
    assert out.rejected_rewards.item() == pytest.approx(-0.1)


def test_conservative_dpo_mixes_both_directions():
    out = preference_loss(PI_C, PI_R, REF_C, REF_R, name="dpo", beta=0.5, label_smoothing=0.2)
    expected = -math.log(sigmoid(1.0)) * 0.8 - math.log(sigmoid(-1.0)) * 0.2  # 0.2507 + 0.2627
    assert out.losses.item() == pytest.approx(expected, rel=1e-6)


def test_ipo_loss_matches_hand_value():
    out = preference_loss(PI_C, PI_R, REF_C, REF_R, name="ipo", beta=0.1)
    assert out.losses.item() == pytest.approx((2 - 1 / 0.2) ** 2)  # (2 - 5)^2 = 9


def test_hinge_loss_matches_hand_value():
    assert preference_loss(PI_C, PI_R, REF_C, REF_R, name="hinge", beta=0.1).losses.item() == pytest.approx(0.8)
    assert preference_loss(PI_C, PI_R, REF_C, REF_R, name="hinge", beta=1.0).losses.item() == 0.0


def test_reference_free_uses_a_uniform_reference():
    out = preference_loss(PI_C, PI_R, None, None, name="dpo", beta=0.1)
    assert out.losses.item() == pytest.approx(-math.log(sigmoid(0.2)))
    assert out.chosen_rewards.item() == pytest.approx(-1.0)  # beta * policy log-prob


@pytest.mark.parametrize("beta", [0.01, 0.1, 0.5])
def test_policy_equal_to_reference_gives_ln2_for_dpo_and_inverse_two_beta_squared_for_ipo(beta):
    logps = torch.tensor([-5.0, -40.0, -300.0])
    other = torch.tensor([-7.0, -20.0, -301.0])
    dpo = preference_loss(logps, other, logps, other, name="dpo", beta=beta)
    ipo = preference_loss(logps, other, logps, other, name="ipo", beta=beta)
    assert torch.allclose(dpo.losses, torch.full((3,), math.log(2)))
    assert torch.allclose(ipo.losses, torch.full((3,), (1 / (2 * beta)) ** 2))


def test_sft_loss_is_mean_token_nll():
    assert sft_loss(torch.tensor([-6.0, -3.0]), torch.tensor([3, 1])).tolist() == [2.0, 3.0]


def test_sequence_logps_sums_only_labelled_tokens_with_the_shift():
    # Vocabulary of 2; logits favour token 1 everywhere: log p(1) = log(e/(1+e)), log p(0) = log(1/(1+e)).
    logits = torch.tensor([[[0.0, 1.0]] * 4])
    labels = torch.tensor([[-100, -100, 1, 0]])  # prompt of 2 tokens, response "1 0"
    logps, count = sequence_logps(logits, labels)
    expected = math.log(math.e / (1 + math.e)) + math.log(1 / (1 + math.e))
    assert logps.item() == pytest.approx(expected, rel=1e-6)
    assert count.item() == 2


@pytest.mark.parametrize("name,beta,eps,setting", [
    ("dpo", 0.0, 0.0, "loss.beta"), ("dpo", -1.0, 0.0, "loss.beta"), ("kto", 0.1, 0.0, "loss.name"),
    ("dpo", 0.1, 0.5, "loss.label_smoothing"),
])
def test_bad_loss_settings_name_the_setting(name, beta, eps, setting):
    with pytest.raises(InvalidConfig, match=setting):
        check_loss_config(name, beta, eps)
