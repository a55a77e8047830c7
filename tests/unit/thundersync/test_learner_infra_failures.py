"""The Learner and infrastructure failures, early start's split: an episode the grader could not
grade is dropped from its group, whenever that is found out; split work is taken back out or
ends early, and the step stays sync's."""

from __future__ import annotations

import pytest
import torch

from tests.unit.thundersync.learner_batches import (
    batch_with_a_group_informative_without_one,
    flag_infra_failure,
    informative_batch,
    learner,
    step_grad,
)
from thundersync import events as ev
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.models import load_model


@pytest.fixture
def model(tiny_model_dirs):
    return load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)


STRATEGIES = {
    "sync": {"streaming": False},
    "streaming": {"streaming": True},
    "streaming-early-start": {"streaming": True, "early_start": True},
    "deterministic-sync": {"streaming": False, "deterministic": True},
    "deterministic-streaming": {"streaming": True, "deterministic": True},
    "off-policy": {"streaming": False, "max_staleness": 1},
}


@pytest.mark.parametrize("options", STRATEGIES.values(), ids=STRATEGIES.keys())
def test_infra_failures_are_excluded_not_scored_zero(model, options):
    """Every strategy drops an infra failure from its group; the group's statistics are over
    the rest: the same step as the batch without that episode."""
    flagged, without = flag_infra_failure(informative_batch(model))
    grads = []
    for batch in (flagged, without):
        lrn = learner(model, max_grad_norm=None, **options)
        for e in batch:
            lrn.consume(e)
        metrics = lrn.step()
        grads.append(step_grad(model))
        assert metrics["num_trajectories"] == len(
            {e.episode_id for e in without if isinstance(e, ev.EpisodeStarted)}
        )
    assert float(grads[0].norm()) > 0
    assert torch.allclose(grads[0], grads[1], rtol=0, atol=1e-15)


def test_an_infra_failure_found_after_early_starts_work_is_taken_back_out(model):
    """Every episode completes before the first reward (grading is the long part), so early
    start has run each one's reward-free half before the failed grading says to drop one:
    that half must come back out, leaving the step of the batch without that episode. The
    budget holds every group's two accumulators and no whole piece, so every episode is
    split."""

    def rewards_last(events):
        rewards = [e for e in events if isinstance(e, ev.RewardReady)]
        return [e for e in events if not isinstance(e, ev.RewardReady)] + rewards

    events, failed = batch_with_a_group_informative_without_one(model)
    flagged, without = flag_infra_failure(events, failed)
    groups = {e.group_id for e in flagged if isinstance(e, ev.EpisodeStarted)}
    params = [p for p in model.parameters() if p.requires_grad]
    copy = sum(p.numel() for p in params) * params[0].element_size()
    grads = []
    for batch in (rewards_last(flagged), rewards_last(without)):
        lrn = learner(
            model,
            max_grad_norm=None,
            streaming=True,
            early_start=True,
            buffer_budget_bytes=2 * len(groups) * copy,
        )
        for e in batch:
            lrn.consume(e)
        lrn.step()
        grads.append(step_grad(model))
    assert float(grads[0].norm()) > 0
    assert torch.allclose(grads[0], grads[1], rtol=1e-12, atol=1e-15)


def test_split_work_whose_reward_is_the_shift_ends_at_its_first_half(model):
    """Tests that pass or fail, graded after every episode completed: early start splits each
    episode (docs/design.md §3), and at its reward adds (rᵢ − c) hᵢ, where c is its group's
    first reward. Where rᵢ = c that is 0: the episode's work ended at its first half. So an
    episode whose reward is its group's first has one piece of work published, the others
    two, and the step is sync's."""
    shape = BatchShape(
        min_groups=2,
        max_groups=2,
        min_group_size=3,
        max_group_size=3,
        max_turns=2,
        max_tokens=32,
        infra_failure_rate=0.0,
        reward_values=(0.0, 1.0),
        continuous_rate=0.0,
    )
    events = random_batch(3, model.config.vocab_size, shape)
    rewards = [e for e in events if isinstance(e, ev.RewardReady)]
    events = [e for e in events if not isinstance(e, ev.RewardReady)] + rewards
    group = {e.episode_id: e.group_id for e in events if isinstance(e, ev.EpisodeStarted)}
    first: dict[str, float] = {}
    for e in rewards:
        first.setdefault(group[e.episode_id], e.reward)
    assert any(e.reward != first[group[e.episode_id]] for e in rewards)
    params = [p for p in model.parameters() if p.requires_grad]
    copy = sum(p.numel() for p in params) * params[0].element_size()
    published: list[ev.Event] = []
    lrn = learner(
        model,
        max_grad_norm=None,
        early_start=True,
        buffer_budget_bytes=2 * len(first) * copy,  # the groups' sums, no whole piece
        publish=published.append,
    )
    for e in events:
        lrn.consume(e)
    lrn.step()
    pieces = [e.episode_id for e in published if isinstance(e, ev.GradientComputed)]
    expected = {e.episode_id: 1 + int(e.reward != first[group[e.episode_id]]) for e in rewards}
    assert {eid: pieces.count(eid) for eid in expected} == expected
    split = step_grad(model)
    sync = learner(model, streaming=False, max_grad_norm=None)
    for e in events:
        sync.consume(e)
    sync.step()
    assert torch.allclose(split, step_grad(model), rtol=1e-12, atol=1e-15)
