"""The Learner's contract: staleness audit, complete batches, one optimizer step, events."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from tests.unit.thundersync.learner_batches import SHAPE, informative_batch, learner
from thundersync import (
    GRPO,
    OPD,
    EventOrderError,
    IncompleteBatchError,
    InvalidEventError,
    Learner,
    NonFiniteGradientError,
    StaleTokenError,
)
from thundersync import events as ev
from thundersync.core.assembly import natural_key
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.models import load_model
from thundersync.protocol.episode import EpisodeRecord


@pytest.fixture
def model(tiny_model_dirs):
    return load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)


def test_streaming_refuses_a_stale_token(model):
    lrn = learner(model)
    events = informative_batch(model)
    stale = next(e for e in events if isinstance(e, ev.TurnCompleted))
    for e in events[: events.index(stale)]:
        lrn.consume(e)
    bad = ev.TurnCompleted(
        episode_id=stale.episode_id,
        turn=stale.turn,
        action_ids=stale.action_ids,
        action_logprobs=stale.action_logprobs,
        policy_version=stale.policy_version - 1,
    )
    with pytest.raises(StaleTokenError, match="version -1.*version 0"):
        lrn.consume(bad)


def test_after_a_step_tokens_of_the_old_version_are_stale(model):
    lrn = learner(model)
    for e in informative_batch(model):
        lrn.consume(e)
    metrics = lrn.step()
    assert metrics["policy_version"] == lrn.policy_version == 1
    with pytest.raises(StaleTokenError):
        lrn.consume(next(e for e in informative_batch(model) if isinstance(e, ev.EpisodeStarted)))


def test_sync_accepts_tokens_of_any_version(model):
    lrn = learner(model, streaming=False)
    for e in random_batch(0, model.config.vocab_size, SHAPE, policy_version=5):
        lrn.consume(e)
    lrn.step()


def test_step_takes_one_optimizer_step_with_the_clipped_gradient(model):
    before = [p.detach().clone() for p in model.parameters()]
    lrn = learner(model, lr=0.5, max_grad_norm=1e-3, keep_last_gradient=True)
    for e in informative_batch(model):
        lrn.consume(e)
    metrics = lrn.step()
    assert metrics["grad_norm"] > 1e-3
    assert float(lrn.last_gradient.norm()) == pytest.approx(1e-3, rel=1e-3)
    moved = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())])
    assert torch.allclose(moved, 0.5 * lrn.last_gradient, atol=1e-15)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.equal(grads, lrn.last_gradient)


@pytest.mark.parametrize("missing", ["RewardReady", "EpisodeCompleted", "EpisodeStarted"])
def test_step_on_an_incomplete_batch_says_what_is_missing(model, missing):
    lrn = learner(model)
    events = informative_batch(model)
    drop = next(e for e in events if type(e).__name__ == missing)
    for e in events:
        if e is not drop:
            lrn.consume(e)
    with pytest.raises(IncompleteBatchError, match=drop.episode_id[:2]):
        lrn.step()


def test_step_on_an_empty_batch_fails_clearly(model):
    with pytest.raises(IncompleteBatchError, match="empty batch"):
        learner(model).step()


def test_opd_needs_every_teacher_score(model):
    lrn = learner(model, objective=OPD())
    events = random_batch(1, model.config.vocab_size, SHAPE, teacher=True)
    dropped = next(e for e in events if isinstance(e, ev.TeacherScored))
    for e in events:
        if e is not dropped:
            lrn.consume(e)
    with pytest.raises(IncompleteBatchError, match="teacher"):
        lrn.step()


def test_contradictory_events_are_rejected(model):
    lrn = learner(model)
    start = next(e for e in informative_batch(model) if isinstance(e, ev.EpisodeStarted))
    lrn.consume(start)
    with pytest.raises(EventOrderError, match="already started"):
        lrn.consume(start)
    with pytest.raises(InvalidEventError, match="2 action_ids but 1 action_logprobs"):
        lrn.consume(
            ev.TurnCompleted(
                episode_id=start.episode_id,
                turn=0,
                action_ids=(5, 6),
                action_logprobs=(-1.0,),
                policy_version=0,
            )
        )


def test_kl_without_a_reference_model_is_a_clear_error(model):
    with pytest.raises(ValueError, match="reference"):
        learner(model, objective=GRPO(kl_coef=0.1))


def test_streaming_publishes_gradient_work_as_it_happens(model):
    published: list[ev.Event] = []
    lrn = learner(model, publish=published.append)
    events = informative_batch(model)
    first_reward = next(i for i, e in enumerate(events) if isinstance(e, ev.RewardReady))
    for e in events[: first_reward + 1]:
        lrn.consume(e)
    # The first trajectory's backward ran at its reward, long before the step.
    assert [type(e).__name__ for e in published] == ["GradientComputed"]
    for e in events[first_reward + 1 :]:
        lrn.consume(e)
    lrn.step()
    assert isinstance(published[-1], ev.StepFinished)


# --- a non-finite gradient, resuming, memory -------------------------------------------------


NON_FINITE = {
    "sync": (GRPO(), {"streaming": False}),
    "streaming": (GRPO(), {"streaming": True}),
    "deterministic-streaming": (GRPO(), {"streaming": True, "deterministic": True}),
    "off-policy": (GRPO(), {"streaming": False, "max_staleness": 1}),
    "opd-sync": (OPD(), {"streaming": False}),
    "opd-streaming": (OPD(granularity="turn"), {"streaming": True}),
}


@pytest.mark.parametrize("objective,options", NON_FINITE.values(), ids=NON_FINITE.keys())
def test_a_non_finite_gradient_steps_nothing_and_the_next_batch_steps(model, objective, options):
    teacher = isinstance(objective, OPD)
    first, second = (
        random_batch(11 + v, model.config.vocab_size, SHAPE, teacher=teacher, policy_version=v)
        for v in (0, 1)
    )
    lrn = Learner(model, objective, torch.optim.Adam(model.parameters(), lr=1e-3), **options)
    for e in first:
        lrn.consume(e)
    lrn.step()  # the optimizer now has state, and every parameter a .grad
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    state = {
        k: v.clone()
        for p in model.parameters()
        for k, v in lrn.optimizer.state[p].items()
        if torch.is_tensor(v)
    }
    state_before = [v.clone() for v in state.values()]
    poisoned = next(iter(model.parameters()))
    hook = poisoned.register_hook(lambda g: torch.full_like(g, float("nan")))
    try:
        for e in second:
            lrn.consume(e)
        with pytest.raises(NonFiniteGradientError, match="no optimizer step.*policy_version"):
            lrn.step()
    finally:
        hook.remove()
    assert all(torch.equal(a, p) for a, p in zip(params, model.parameters()))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    after = {
        k: v
        for p in model.parameters()
        for k, v in lrn.optimizer.state[p].items()
        if torch.is_tensor(v)
    }
    assert all(torch.equal(a, b) for a, b in zip(state_before, after.values()))
    assert (lrn.policy_version, lrn.num_steps) == (1, 1)
    for e in second:  # the dropped batch's episodes are new to the learner
        lrn.consume(e)
    metrics = lrn.step()
    assert (metrics["step"], metrics["policy_version"]) == (2, 2)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_resumed_learner_continues_numbering_and_version(model):
    lrn = learner(model, policy_version=7, num_steps=3)
    events = random_batch(0, model.config.vocab_size, SHAPE, policy_version=7)
    for e in events:
        lrn.consume(e)
    metrics = lrn.step()
    assert (metrics["step"], metrics["policy_version"]) == (4, 8)
    assert (lrn.num_steps, lrn.policy_version) == (4, 8)
    with pytest.raises(StaleTokenError, match="version 7.*version 8"):
        lrn.consume(next(e for e in events if isinstance(e, ev.EpisodeStarted)))


@pytest.mark.parametrize(
    "options",
    [{"policy_version": -1}, {"num_steps": 1.5}, {"max_staleness": True}, {"micro_batch_size": 0}],
)
def test_bad_options_are_refused_by_name(model, options):
    with pytest.raises(ValueError, match=next(iter(options))):
        learner(model, **options)


def test_no_copy_of_the_gradient_outlives_a_step(model):
    """.grad holds the step's gradient without a clone per parameter: views of one vector at
    the first step, then the same .grad tensors, written in place; no last_gradient."""
    for p in model.parameters():
        p.grad = None
    lrn = learner(model, streaming=False)
    for e in informative_batch(model):
        lrn.consume(e)
    lrn.step()
    assert lrn.last_gradient is None
    storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storages) == 1
    grads = [p.grad for p in model.parameters()]
    lrn2 = learner(model, streaming=True)
    for e in informative_batch(model, seed=5):
        lrn2.consume(e)
    lrn2.step()
    assert all(g is p.grad for g, p in zip(grads, model.parameters()))
    assert lrn2.last_gradient is None


def test_keep_last_gradient_keeps_a_separate_copy(model):
    lrn = learner(model, max_grad_norm=None, keep_last_gradient=True)
    for e in informative_batch(model):
        lrn.consume(e)
    lrn.step()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert torch.equal(lrn.last_gradient, grads) and float(grads.norm()) > 0
    for p in model.parameters():
        p.grad.zero_()
    assert float(lrn.last_gradient.norm()) > 0


@pytest.mark.parametrize("streaming", [False, True])
def test_a_step_that_makes_a_parameter_non_finite_stops_the_learner(model, streaming):
    """lr=1e308: the gradient is finite, the update is not. The step raises before it counts
    or is published, and every later step is refused (the parameters are the optimizer's)."""
    from thundersync import NonFiniteParameterError

    replica = copy.deepcopy(model).float()  # the update overflows float32
    published: list = []
    lrn = Learner(
        replica,
        GRPO(),
        torch.optim.AdamW(replica.parameters(), lr=1e308),
        streaming=streaming,
        max_grad_norm=None,
        publish=published.append,
    )
    for e in random_batch(5, model.config.vocab_size, SHAPE):
        lrn.consume(e)
    with pytest.raises(NonFiniteParameterError, match="step 1: .*non-finite.*policy_version st"):
        lrn.step()
    assert (lrn.policy_version, lrn.num_steps) == (0, 0)
    assert not any(isinstance(e, ev.StepFinished) for e in published)
    for e in random_batch(6, model.config.vocab_size, SHAPE, policy_version=0):
        lrn.consume(e)
    with pytest.raises(NonFiniteParameterError):
        lrn.step()


def test_all_finite_sees_inf_and_nan_but_not_huge_finite_values():
    from thundersync.core.learner import all_finite

    huge = [torch.full((3,), 3e38), torch.full((2,), 1e308, dtype=torch.float64)]
    assert all_finite(huge)  # a 2-norm of these would overflow
    for bad in (float("inf"), float("-inf"), float("nan")):
        assert not all_finite([*huge, torch.tensor([0.0, bad])])


def test_opd_per_turn_gradient_runs_before_its_tool_call_returns(model):
    """Turn k's gradient needs action k and its teacher scores, not turn k's observation: it
    is computed while the tool runs (docs/design.md §3, on-policy distillation)."""
    published: list[ev.Event] = []
    lrn = learner(model, objective=OPD(granularity="turn"), publish=published.append)
    eid = "0-g0-e0"
    lrn.consume(
        ev.EpisodeStarted(
            episode_id=eid,
            group_id="0-g0",
            group_size=1,
            task_id="t",
            prompt_ids=(1, 2, 3),
            policy_version=0,
        )
    )
    lrn.consume(
        ev.TurnCompleted(
            episode_id=eid,
            turn=0,
            action_ids=(4, 5),
            action_logprobs=(-1.0, -2.0),
            policy_version=0,
        )
    )
    assert published == []  # no teacher scores yet
    lrn.consume(ev.TeacherScored(episode_id=eid, turn=0, teacher_logprobs=(-0.5, -0.7)))
    assert [(type(e).__name__, e.turn) for e in published] == [("GradientComputed", 0)]


def test_opd_turns_ready_together_share_one_pass(model):
    """A worker drains what queued while it computed (``eager=False``): the ready turns of
    every episode still being played go into one padded pass, not a pass each (each turn is
    still announced, with the pass's start)."""
    published: list[ev.Event] = []
    lrn = learner(model, objective=OPD(granularity="turn"), publish=published.append, eager=False)
    events = random_batch(3, model.config.vocab_size, replace(SHAPE, max_turns=3), teacher=True)
    for event in events:
        if not isinstance(event, ev.EpisodeCompleted):  # no episode wholly ready yet
            lrn.consume(event)
    lrn.drain()
    turns = sum(isinstance(e, ev.TurnCompleted) for e in events)
    done = [e for e in published if isinstance(e, ev.GradientComputed)]
    assert turns > 2 and len(done) == turns
    assert len({e.started for e in done}) == 1
    for event in events:
        if isinstance(event, ev.EpisodeCompleted):
            lrn.consume(event)
    lrn.step()  # nothing left to compute, every piece already in the step's gradient
    assert len([e for e in published if isinstance(e, ev.GradientComputed)]) == turns


def test_opd_auto_learns_a_turns_cost_from_a_batched_pass(model):
    """``auto`` does per-turn work while tool calls outlast a turn's backward: with instant
    tools, episodes that start after a batched pass of turns has been timed are done whole."""
    published: list[ev.Event] = []
    lrn = learner(model, objective=OPD(), publish=published.append, eager=False)
    shape = replace(SHAPE, min_groups=2, max_groups=2, min_group_size=2, max_turns=3)
    events = [
        replace(e, duration_s=0.0) if isinstance(e, ev.ToolFinished) else e
        for e in random_batch(4, model.config.vocab_size, shape, teacher=True, arrival="batch")
    ]
    group = {e.episode_id: e.group_id for e in events if isinstance(e, ev.EpisodeStarted)}
    first, later = (
        [e for e in events if group[e.episode_id] == g] for g in sorted(set(group.values()))
    )
    for batch in (first, later):  # each group's episodes all played, none completed yet
        for event in batch:
            if not isinstance(event, ev.EpisodeCompleted):
                lrn.consume(event)
        lrn.drain()
    for event in events:
        if isinstance(event, ev.EpisodeCompleted):
            lrn.consume(event)
    lrn.step()
    done = [e for e in published if isinstance(e, ev.GradientComputed)]
    first_turns = {e.turn for e in done if group[e.episode_id] == group[first[0].episode_id]}
    later_turns = {e.turn for e in done if group[e.episode_id] == group[later[0].episode_id]}
    assert first_turns and None not in first_turns  # nothing measured yet: per turn, batched
    assert later_turns == {None}  # whole episodes: the tools are faster than a turn


@pytest.mark.parametrize("objective", [GRPO(), OPD()], ids=["grpo", "opd"])
def test_sync_pads_each_micro_batch_only_to_trajectories_of_like_length(
    model, objective, monkeypatch
):
    """A sync step's padded forwards take the batch's trajectories shortest first, at most
    ``micro_batch_size`` rows and none more than twice the micro-batch's shortest, so each
    micro-batch pads to about its own length. (In the batch's own order an agentic batch's
    micro-batches computed about three padding tokens per real one; four at a time
    shortest first, a micro-batch of three one-turn rows and a long one about two.)"""
    from thundersync.core.policy import Policy

    shape = BatchShape(
        min_groups=2,
        max_groups=2,
        min_group_size=6,
        max_group_size=6,
        max_turns=6,
        max_tokens=200,
        infra_failure_rate=0.0,
    )
    events = random_batch(3, model.config.vocab_size, shape, teacher=isinstance(objective, OPD))
    rows: list[list[int]] = []
    forward = Policy.batch_action_logprobs

    def spy(self, trajectories):
        rows.append([len(t.context_ids()[0]) for t in trajectories])
        return forward(self, trajectories)

    monkeypatch.setattr(Policy, "batch_action_logprobs", spy)
    sync = learner(model, streaming=False, objective=objective, micro_batch_size=4)
    for event in events:
        sync.consume(event)
    sync.step()
    lengths = [n for batch in rows for n in batch]
    assert len(lengths) == 12 and all(1 <= len(batch) <= 4 for batch in rows)
    assert lengths == sorted(lengths)
    assert all(max(batch) <= 2 * min(batch) for batch in rows)
    padded = sum(len(batch) * max(batch) for batch in rows)
    fours = sum(4 * max(lengths[k : k + 4]) for k in range(0, 12, 4))
    assert padded <= fours
    records: dict[str, EpisodeRecord] = {}
    for event in events:
        if isinstance(getattr(event, "episode_id", None), str):
            records.setdefault(event.episode_id, EpisodeRecord(event.episode_id)).fold(event)
    in_order = [
        len(records[eid].trajectory().context_ids()[0]) for eid in sorted(records, key=natural_key)
    ]
    assert sorted(in_order) == lengths and in_order != lengths  # the batch's order pads more
