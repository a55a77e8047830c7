"""Objective conventions that peers differ on, pinned down."""

from __future__ import annotations

import statistics

import pytest
import torch

from thundersync.core.objectives import (
    GRPO,
    OPD,
    clip_coefficient,
    denominator,
    group_advantages,
    kl_penalty,
)


def test_advantages_use_the_unbiased_std_and_epsilon():
    rewards = [0.0, 1.0, 1.0, 0.5]
    mu, sd = statistics.fmean(rewards), statistics.stdev(rewards)
    expected = [(r - mu) / (sd + 1e-6) for r in rewards]
    assert group_advantages(rewards, GRPO()) == pytest.approx(expected, rel=1e-15)


def test_dr_grpo_does_not_scale_by_std():
    assert group_advantages([0.0, 2.0], GRPO(scale_by_std=False)) == [-1.0, 1.0]


@pytest.mark.parametrize("rewards", [[1.0], [0.1, 0.1, 0.1], [7.0, 7.0]])
def test_degenerate_groups_get_exactly_zero(rewards):
    assert group_advantages(rewards, GRPO()) == [0.0] * len(rewards)


def test_denominators():
    assert denominator("token-mean", [3, 5]) == 8.0
    assert denominator("seq-mean-token-mean", [3, 5]) == 2.0
    assert denominator("seq-mean-token-sum-norm", [3, 5]) == 2.0


def test_k3_is_nonnegative_and_zero_at_the_reference():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.5, -2.0, -0.1], dtype=torch.float64)
    k3 = kl_penalty(logp, ref, "k3")
    assert (k3 >= 0).all() and k3[1] == 0
    assert torch.equal(kl_penalty(logp, ref, "k1"), logp - ref)


def test_clip_coefficient_matches_torch():
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([3.0, 4.0, 0.0])
    torch.nn.utils.clip_grad_norm_([p], 1.0)
    assert p.grad.norm().item() == pytest.approx(5.0 * clip_coefficient(5.0, 1.0), rel=1e-6)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"loss_agg": "mean"}, "loss_agg"),
        ({"kl_estimator": "k2"}, "kl_estimator"),
        ({"max_groups": 2}, "max_groups"),
    ],
)
def test_bad_grpo_configs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GRPO(**kwargs)


def test_bad_opd_granularity_is_rejected():
    with pytest.raises(ValueError, match="granularity"):
        OPD(granularity="token")


@pytest.mark.parametrize(
    "cls, keywords, says",
    [
        (GRPO, {"kl_coef": float("nan")}, "GRPO keyword 'kl_coef': input should be a finite"),
        (GRPO, {"kl_coef": -1.0}, "GRPO keyword 'kl_coef': input should be greater than or equal"),
        (GRPO, {"clip_high": float("inf")}, "GRPO keyword 'clip_high': input should be a finite"),
        (GRPO, {"eps": -1.0}, "GRPO keyword 'eps'"),
        (GRPO, {"tis_cap": -2.0}, "GRPO keyword 'tis_cap'"),
        (GRPO, {"max_tokens": True}, "GRPO keyword 'max_tokens': input should be a valid integer"),
        (GRPO, {"dynamic_sampling": 1}, "GRPO keyword 'dynamic_sampling': input should be a valid"),
        (OPD, {"max_tokens": 0}, "OPD keyword 'max_tokens'"),
        (OPD, {"granularity": "step"}, "OPD keyword 'granularity'"),
    ],
)
def test_every_keyword_is_typed_and_ranged(cls, keywords, says):
    with pytest.raises(ValueError, match=rf"^{says}"):
        cls(**keywords)
