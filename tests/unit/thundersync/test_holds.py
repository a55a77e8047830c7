"""Deposits held for their group's close (``thundersync.core.holds``): held only where every
member has completed, for at most the time the held work takes as finals, released by the
clock or by the close, and the step the same either way (docs/design.md §3)."""

from __future__ import annotations

import pytest
import torch

from tests.property import textbook
from tests.unit.thundersync.learner_batches import learner
from thundersync import events as ev
from thundersync.core import streaming_grpo
from thundersync.core.holds import Pace
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.models import load_model

SHAPE = BatchShape(
    max_groups=2, max_group_size=4, max_turns=2, max_tokens=32, infra_failure_rate=0.0
)


@pytest.fixture
def model(tiny_model_dirs):
    return load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)


class Clock:
    """``time.monotonic`` for the strategy, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(streaming_grpo.time, "monotonic", fake)
    return fake


def graded_last(seed: int, model, min_size: int = 2) -> tuple[list[ev.Event], list[ev.RewardReady]]:
    """A batch whose groups have ``min_size`` or more members and rewards that differ, every
    episode completed before the first reward (the rewards are being graded): its events
    without the rewards, and the rewards."""
    for s in range(seed, seed + 500):
        events = random_batch(s, model.config.vocab_size, SHAPE)
        sizes = [e.group_size for e in events if isinstance(e, ev.EpisodeStarted)]
        rewards = [e for e in events if isinstance(e, ev.RewardReady)]
        if min(sizes) >= min_size and len({r.reward for r in rewards}) > 1:
            return [e for e in events if not isinstance(e, ev.RewardReady)], rewards
    raise AssertionError("no such batch")


def holding(model, published, seconds_per_token):
    lrn = learner(
        model, eager=False, hold_deposits=True, publish=published.append, max_grad_norm=None
    )
    lrn.pace.seconds_per_token = seconds_per_token
    return lrn


def passes(published) -> int:
    """Learner passes so far: the ``GradientComputed`` events that share a start are one."""
    return len({e.started for e in published if isinstance(e, ev.GradientComputed)})


def test_a_deposit_waits_for_its_groups_close_and_becomes_a_final(model, clock):
    published: list[ev.Event] = []
    lrn = holding(model, published, seconds_per_token=1.0)  # a long hold
    completed, rewards = graded_last(0, model)
    for e in completed + rewards[:1]:
        lrn.consume(e)
    lrn.drain()
    assert passes(published) == 0  # held: its group is being graded
    assert lrn.wake_after() > 0.0
    for e in rewards[1:]:
        lrn.consume(e)
    lrn.drain()
    assert passes(published) == 1  # every trajectory a final, in one batched pass
    assert lrn.wake_after() is None
    lrn.step()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    book = textbook.gradient(model, lrn.objective, completed + rewards)
    assert float((grad - book).norm()) <= 1e-12 * float(book.norm())


def test_a_hold_lasts_what_its_trajectories_take_as_finals_then_it_deposits(model, clock):
    published: list[ev.Event] = []
    lrn = holding(model, published, seconds_per_token=1e-3)
    completed, rewards = graded_last(1, model, min_size=3)
    group = {e.episode_id: e.group_id for e in completed if isinstance(e, ev.EpisodeStarted)}
    first, second = [r for r in rewards if group[r.episode_id] == group[rewards[0].episode_id]][:2]
    for e in completed + [first]:
        lrn.consume(e)
    lrn.drain()

    def hold_s(reward: ev.RewardReady) -> float:
        rec = lrn.strategy.unblocked[reward.episode_id]
        return rec.trajectory().context_length() * 1e-3

    assert passes(published) == 0 and lrn.wake_after() == pytest.approx(hold_s(first))
    clock.now += hold_s(first) / 2
    lrn.consume(second)
    lrn.drain()  # the second reward lengthens the hold by its own trajectory's time
    assert passes(published) == 0
    assert lrn.wake_after() == pytest.approx(hold_s(first) / 2 + hold_s(second))
    clock.now += hold_s(first) / 2 + hold_s(second)
    lrn.drain()
    computed = {e.episode_id for e in published if isinstance(e, ev.GradientComputed)}
    assert computed == {first.episode_id, second.episode_id}  # the hold ran out: deposited
    assert lrn.wake_after() is None


def test_nothing_is_held_while_a_member_is_still_rolling_out(model, clock):
    published: list[ev.Event] = []
    lrn = holding(model, published, seconds_per_token=1.0)
    completed, rewards = graded_last(2, model)
    first = rewards[0].episode_id
    group = next(e.group_id for e in completed if getattr(e, "episode_id", None) == first)
    members = {e.episode_id for e in completed if getattr(e, "group_id", None) == group}
    other = sorted(members - {first})[0]
    not_done = [
        e for e in completed if not (isinstance(e, ev.EpisodeCompleted) and e.episode_id == other)
    ]
    for e in not_done + rewards[:1]:
        lrn.consume(e)
    lrn.drain()
    assert passes(published) == 1  # deposited at once: the group cannot close soon
    assert lrn.wake_after() is None


def test_without_a_caller_that_wakes_it_the_learner_holds_nothing(model):
    assert learner(model).pace is None  # eager: drains at every event
    assert learner(model, eager=False).pace is None  # not asked for
    assert learner(model, streaming=False, eager=False, hold_deposits=True).pace is None


def test_the_pace_is_measured_on_the_learners_finals(model):
    lrn = learner(model, eager=False, hold_deposits=True)
    assert lrn.pace.seconds_per_token is None  # nothing is held before the first measure
    completed, rewards = graded_last(3, model)
    for e in completed + rewards:
        lrn.consume(e)
    lrn.drain()
    lrn.step()
    assert lrn.pace.seconds_per_token is not None and lrn.pace.seconds_per_token > 0.0


def test_the_pace_follows_the_passes_and_ignores_empty_ones():
    pace = Pace()
    assert pace.hold_s(100) == 0.0
    pace.note(1.0, 100)
    assert pace.hold_s(10) == pytest.approx(0.1)
    pace.note(0.0, 100)
    pace.note(1.0, 0)
    pace.note(3.0, 100)  # a quarter of the way to 0.03 s a token
    assert pace.seconds_per_token == pytest.approx(0.01 + 0.25 * 0.02)
