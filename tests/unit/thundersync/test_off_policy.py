"""Async training (``max_staleness > 0``): which versions are accepted, and the clip acts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.property.test_off_policy import behaviour_batch
from thundersync import GRPO, OPD, Learner, StaleTokenError
from thundersync import events as ev
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.models import load_model

SHAPE = BatchShape(
    max_groups=2,
    max_group_size=3,
    max_turns=2,
    max_tokens=32,
    infra_failure_rate=0.0,
    reward_values=(0.0, 1.0),
)


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)


def make(model, objective=None, **kwargs) -> Learner:
    return Learner(
        model,
        objective or GRPO(),
        torch.optim.SGD(model.parameters(), lr=0.0),
        max_grad_norm=None,
        **kwargs,
    )


def gradient(model, events, objective=None, **kwargs) -> tuple[torch.Tensor, dict]:
    learner = make(model, objective, **kwargs)
    for e in events:
        learner.consume(e)
    metrics = learner.step()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]), metrics


def test_tokens_one_version_behind_are_accepted_two_behind_refused(model):
    learner = make(model, max_staleness=1, policy_version=2)
    for e in random_batch(0, model.config.vocab_size, SHAPE, policy_version=1):
        learner.consume(e)
    metrics = learner.step()
    assert metrics["max_staleness_seen"] == 1 and set(metrics["staleness_histogram"]) == {"1"}
    for version, says in ((1, "version 1.*versions 2..3"), (4, "version 4.*versions 2..3")):
        events = random_batch(1, model.config.vocab_size, SHAPE, policy_version=version)
        start = next(e for e in events if isinstance(e, ev.EpisodeStarted))
        with pytest.raises(StaleTokenError, match=says):
            learner.consume(start)
        learner.consume(dataclasses.replace(start, policy_version=3))
        turn = next(e for e in events if isinstance(e, ev.TurnCompleted))
        with pytest.raises(StaleTokenError, match="max_staleness=1"):
            learner.consume(turn)
        learner.consume(dataclasses.replace(turn, policy_version=2))
        learner = make(model, max_staleness=1, policy_version=3)


@pytest.mark.parametrize(
    "objective,options,says",
    [
        (GRPO(), {"streaming": True}, "zero-staleness"),
        (OPD(), {}, "OPD"),
        (GRPO(tis_cap=2.0), {}, "tis_cap"),
    ],
)
def test_combinations_where_staleness_cannot_act_are_refused(model, objective, options, says):
    with pytest.raises(ValueError, match=says):
        make(model, objective, max_staleness=1, **options)


def test_the_clip_acts_off_policy_and_nowhere_else(model):
    """Every knob acts, or it is documented not to: on-policy the ratio is 1 and clip_low /
    clip_high change nothing; off-policy they change the step and clip_fraction counts."""
    events = behaviour_batch(model, 4, version=1)
    wide, narrow = GRPO(clip_low=0.9, clip_high=100.0), GRPO(clip_low=0.01, clip_high=0.01)
    on_wide, m_on = gradient(model, events, wide, policy_version=1)
    on_narrow, _ = gradient(model, events, narrow, policy_version=1)
    assert torch.equal(on_wide, on_narrow) and m_on["clip_fraction"] == 0.0
    off_wide, m_wide = gradient(model, events, wide, policy_version=1, max_staleness=1)
    off_narrow, m_narrow = gradient(model, events, narrow, policy_version=1, max_staleness=1)
    assert m_narrow["clip_fraction"] > m_wide["clip_fraction"]
    assert 0.0 < m_narrow["clip_fraction"] <= 1.0
    assert float((off_wide - off_narrow).norm()) > 1e-3 * float(off_wide.norm())
    assert float((off_wide - on_wide).norm()) > 1e-3 * float(on_wide.norm())
