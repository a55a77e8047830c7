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
from thundersync.core.holds import Pace, next_deposit
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


def two_open_groups(seed: int, model):
    """A batch of two groups of three or more members whose rewards differ: its events but the
    rewards and each group's last completion; those completions by group; the rewards by
    group, in arrival order."""
    for s in range(seed, seed + 500):
        completed, rewards = graded_last(s, model, min_size=3)
        group = {e.episode_id: e.group_id for e in completed if isinstance(e, ev.EpisodeStarted)}
        if len(set(group.values())) != 2:
            continue
        by_group: dict[str, list[ev.RewardReady]] = {}
        for r in rewards:
            by_group.setdefault(group[r.episode_id], []).append(r)
        last = {gid: rs[-1].episode_id for gid, rs in by_group.items()}
        late = {
            gid: next(
                e for e in completed if isinstance(e, ev.EpisodeCompleted) and e.episode_id == eid
            )
            for gid, eid in last.items()
        }
        early = [e for e in completed if not any(e is x for x in late.values())]
        return early, late, by_group
    raise AssertionError("no such batch")


def drained(lrn, published) -> set[str]:
    """The episodes whose gradient work one ``drain`` did."""
    before = len(published)
    lrn.drain()
    return {e.episode_id for e in published[before:] if isinstance(e, ev.GradientComputed)}


def ids(rewards) -> set[str]:
    return {r.episode_id for r in rewards}


def exact(model, lrn, events) -> None:
    lrn.step()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    book = textbook.gradient(model, lrn.objective, events)
    assert float((grad - book).norm()) <= 1e-12 * float(book.norm())


def test_a_drain_deposits_one_group_and_comes_back_for_the_next(model, clock):
    published: list[ev.Event] = []
    lrn = holding(model, published, seconds_per_token=1.0)
    early, late, rewards = two_open_groups(0, model)
    (a, a_rewards), (b, b_rewards) = sorted(rewards.items())
    for e in early + a_rewards[:-2] + b_rewards[:1]:  # a: two unrewarded; b: all but one
        lrn.consume(e)
    # the group furthest from closing first (ties: a), the other at the next drain
    b_first = len(b_rewards) - 1 > 2
    first, second = (b_rewards[:1], a_rewards[:-2]) if b_first else (a_rewards[:-2], b_rewards[:1])
    assert drained(lrn, published) == ids(first)
    assert lrn.wake_after() == 0.0
    assert drained(lrn, published) == ids(second)
    assert lrn.wake_after() is None
    for e in [late[a], late[b], *a_rewards[-2:], *b_rewards[1:]]:
        lrn.consume(e)
    lrn.drain()
    exact(model, lrn, early + list(late.values()) + a_rewards + b_rewards)


def test_a_group_that_closes_while_another_deposits_takes_its_waiting_ones_as_finals(model, clock):
    published: list[ev.Event] = []
    lrn = holding(model, published, seconds_per_token=1.0)
    early, late, rewards = two_open_groups(1, model)
    (a, a_rewards), (b, b_rewards) = sorted(rewards.items())
    for e in early + a_rewards[:-1] + b_rewards[:-1]:
        lrn.consume(e)
    deposited = drained(lrn, published)  # one group's deposit; the other's waits
    waiting, other = (b, a) if deposited == ids(a_rewards[:-1]) else (a, b)
    assert deposited == ids(rewards[other][:-1])
    for e in [late[waiting], rewards[waiting][-1]]:  # the waiting group closes
        lrn.consume(e)
    assert lrn.wake_after() == 0.0
    assert drained(lrn, published) == ids(rewards[waiting])  # all finals, nothing else
    assert lrn.wake_after() is None
    for e in [late[other], rewards[other][-1]]:
        lrn.consume(e)
    lrn.drain()
    exact(model, lrn, early + list(late.values()) + a_rewards + b_rewards)


def test_finals_run_before_deposits_and_the_deposits_wait_one_drain(model, clock):
    published: list[ev.Event] = []
    lrn = holding(model, published, seconds_per_token=1.0)
    early, late, rewards = two_open_groups(2, model)
    (a, a_rewards), (b, b_rewards) = sorted(rewards.items())
    for e in [*early, late[a], *a_rewards, *b_rewards[:-1]]:  # a closed; b's deposit ready
        lrn.consume(e)
    assert drained(lrn, published) == ids(a_rewards)
    assert lrn.wake_after() == 0.0
    assert drained(lrn, published) == ids(b_rewards[:-1])
    assert lrn.wake_after() is None
    for e in [late[b], b_rewards[-1]]:
        lrn.consume(e)
    lrn.drain()
    exact(model, lrn, early + list(late.values()) + a_rewards + b_rewards)


def test_a_learner_whose_caller_does_not_come_back_does_everything_in_one_drain(model):
    published: list[ev.Event] = []
    lrn = learner(model, eager=False, publish=published.append, max_grad_norm=None)
    early, late, rewards = two_open_groups(0, model)
    (a, a_rewards), (b, b_rewards) = sorted(rewards.items())
    for e in early + a_rewards[:-1] + b_rewards[:-1]:
        lrn.consume(e)
    assert drained(lrn, published) == ids(a_rewards[:-1] + b_rewards[:-1])
    assert lrn.wake_after() is None


def test_the_next_deposit_is_the_group_furthest_from_closing():
    assert next_deposit({"s0-g2": 1, "s0-g10": 3, "s0-g1": 3}) == "s0-g1"
    assert next_deposit({"s0-g2": 2, "s0-g10": 2}) == "s0-g2"  # ties: natural order
