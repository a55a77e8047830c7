"""Batches and a learner for the Learner's tests (``test_learner.py``,
``test_learner_infra_failures.py``)."""

from __future__ import annotations

import torch

from thundersync import GRPO, Learner
from thundersync import events as ev
from thundersync.core.random_batches import BatchShape, random_batch

SHAPE = BatchShape(
    max_groups=2, max_group_size=3, max_turns=2, max_tokens=32, infra_failure_rate=0.0
)


def learner(model, streaming=True, lr=0.0, **kwargs) -> Learner:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return Learner(model, kwargs.pop("objective", GRPO()), opt, streaming=streaming, **kwargs)


def informative_batch(model, seed=0):
    """A batch with at least one group whose rewards differ (so the gradient is nonzero)."""
    for s in range(seed, seed + 200):
        events = random_batch(s, model.config.vocab_size, SHAPE)
        rewards: dict[str, set] = {}
        group = {e.episode_id: e.group_id for e in events if isinstance(e, ev.EpisodeStarted)}
        for e in events:
            if isinstance(e, ev.RewardReady):
                rewards.setdefault(group[e.episode_id], set()).add(e.reward)
        if any(len(r) > 1 for r in rewards.values()):
            return events
    raise AssertionError("no informative batch found")


def batch_with_a_group_informative_without_one(model) -> tuple[list[ev.Event], str]:
    """A batch and one of its episodes whose group's other rewards still differ (so dropping
    it changes the group's statistics, not only its size)."""
    for s in range(200):
        events = random_batch(s, model.config.vocab_size, SHAPE)
        group = {e.episode_id: e.group_id for e in events if isinstance(e, ev.EpisodeStarted)}
        rewards = [(e.episode_id, e.reward) for e in events if isinstance(e, ev.RewardReady)]
        for eid, _ in rewards:
            rest = {r for other, r in rewards if other != eid and group[other] == group[eid]}
            if len(rest) > 1 and not any(getattr(e, "infra_failure", False) for e in events):
                return events, eid
    raise AssertionError("no such batch found")


def flag_infra_failure(
    events: list[ev.Event], episode_id: str | None = None
) -> tuple[list[ev.Event], list[ev.Event]]:
    """(the batch with the reward of ``episode_id`` (default: the first) flagged an
    infrastructure failure, the batch without that episode, its group one smaller)."""
    failed = next(
        e for e in events if isinstance(e, ev.RewardReady) and episode_id in (None, e.episode_id)
    )
    flagged = [
        ev.RewardReady(episode_id=e.episode_id, reward=0.0, infra_failure=True)
        if e is failed
        else e
        for e in events
    ]
    without = [e for e in events if getattr(e, "episode_id", None) != failed.episode_id]
    groups = {e.group_id: e.group_size for e in without if isinstance(e, ev.EpisodeStarted)}
    without = [
        ev.EpisodeStarted(
            episode_id=e.episode_id,
            group_id=e.group_id,
            group_size=groups[e.group_id] - (e.group_id == _group(events, failed)),
            task_id=e.task_id,
            prompt_ids=e.prompt_ids,
            policy_version=0,
        )
        if isinstance(e, ev.EpisodeStarted)
        else e
        for e in without
    ]
    return flagged, without


def step_grad(model) -> torch.Tensor:
    """The step's gradient as the optimizer saw it: every parameter's ``.grad``, flattened."""
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def _group(events, reward_event) -> str:
    return next(
        e.group_id
        for e in events
        if isinstance(e, ev.EpisodeStarted) and e.episode_id == reward_event.episode_id
    )
