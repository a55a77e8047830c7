"""Bad input is refused at ``consume``, before it changes anything, and the learner goes on."""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from fractions import Fraction

import pytest
import torch

from thundersync import GRPO, OPD, EventOrderError, InvalidEventError, Learner
from thundersync import events as ev
from thundersync.models import load_model

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)


def vocab(model) -> int:
    return model.get_input_embeddings().num_embeddings


def episode(
    eid: str,
    reward: float,
    *,
    teacher: bool = False,
    prompt=(5, 6, 7),
    actions=((8, 9), (11, 12, 13)),
    observations=((10,),),
    group_size: int = 2,
) -> list[ev.Event]:
    """One episode of group g0 in causal order."""
    out: list[ev.Event] = [
        ev.EpisodeStarted(
            episode_id=eid,
            group_id="g0",
            group_size=group_size,
            task_id="t",
            prompt_ids=prompt,
            policy_version=0,
        )
    ]
    for k, action in enumerate(actions):
        out.append(
            ev.TurnCompleted(
                episode_id=eid,
                turn=k,
                action_ids=action,
                action_logprobs=(-1.5,) * len(action),
                policy_version=0,
            )
        )
        if teacher:
            out.append(
                ev.TeacherScored(episode_id=eid, turn=k, teacher_logprobs=(-0.5,) * len(action))
            )
        if k < len(observations):
            out.append(
                ev.ToolFinished(
                    episode_id=eid,
                    turn=k,
                    observation_ids=observations[k],
                    duration_s=0.01,
                    exit_code=0,
                    timed_out=False,
                )
            )
    out.append(ev.EpisodeCompleted(episode_id=eid, num_turns=len(actions), stop_reason="x"))
    out.append(ev.RewardReady(episode_id=eid, reward=reward))
    return out


def batch(teacher: bool = False) -> list[ev.Event]:
    return episode("e0", 0.0, teacher=teacher) + episode("e1", 1.0, teacher=teacher)


def make(model, objective=None, **kwargs) -> Learner:
    return Learner(
        model,
        objective or GRPO(),
        torch.optim.SGD(model.parameters(), lr=0.0),
        max_grad_norm=None,
        **kwargs,
    )


def step_grad(learner: Learner, model) -> torch.Tensor:
    learner.step()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def clean_gradient(model, events, **kwargs) -> torch.Tensor:
    learner = make(model, **kwargs)
    for e in events:
        learner.consume(e)
    return step_grad(learner, model)


def first(events, kind, episode_id="e1"):
    return next(e for e in events if isinstance(e, kind) and e.episode_id == episode_id)


BAD_VALUES = [
    (ev.RewardReady, "reward", NAN),
    (ev.RewardReady, "reward", INF),
    (ev.RewardReady, "reward", -INF),
    (ev.RewardReady, "reward", 2e6),
    (ev.RewardReady, "reward", True),
    (ev.RewardReady, "reward", "1.0"),
    (ev.RewardReady, "reward", 10**400),  # float() of these raises OverflowError
    (ev.RewardReady, "reward", Fraction(10**400)),
    (ev.RewardReady, "reward", Decimal("1e400")),
    (ev.RewardReady, "reward", Decimal("sNaN")),
    (ev.TurnCompleted, "action_logprobs", (-1.0, -1e308)),
    (ev.TurnCompleted, "action_logprobs", (-746.0, -1.0)),
    (ev.TurnCompleted, "action_logprobs", (-1.0, -(10**400))),
    (ev.TurnCompleted, "action_logprobs", (-1.0, NAN)),
    (ev.TurnCompleted, "action_logprobs", (-1.0, 0.5)),
    (ev.TurnCompleted, "action_logprobs", (-INF, -1.0)),
    (ev.TurnCompleted, "action_logprobs", (-1.0, True)),
    (ev.TurnCompleted, "action_ids", (8, True)),
    (ev.TurnCompleted, "action_ids", (8.0, 9)),
    (ev.TurnCompleted, "action_ids", ("8", 9)),
    (ev.TurnCompleted, "action_ids", (-1, 9)),
    (ev.TurnCompleted, "action_ids", "vocab"),
    (ev.TurnCompleted, "turn", 0.0),
    (ev.TurnCompleted, "policy_version", False),
    (ev.EpisodeStarted, "prompt_ids", (5, 6.0, 7)),
    (ev.EpisodeStarted, "group_size", 2.0),
    (ev.EpisodeStarted, "group_size", True, "e0"),  # the first member sets the group's size
    (ev.ToolFinished, "observation_ids", "vocab"),
    (ev.ToolFinished, "duration_s", NAN),
    (ev.EpisodeCompleted, "num_turns", 2.0),
]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("case", BAD_VALUES, ids=lambda c: f"{c[0].__name__}-{c[1]}-{c[2]!r:.40}")
def test_a_bad_value_is_refused_and_the_learner_goes_on(model, streaming, case):
    kind, field, value, eid = (*case, "e1") if len(case) == 3 else case
    events = batch()
    good = first(events, kind, eid)
    value = (9, vocab(model)) if value == "vocab" else value
    bad = dataclasses.replace(good, **{field: value})
    learner = make(model, streaming=streaming)
    at = events.index(good)
    for e in events[:at]:
        learner.consume(e)
    with pytest.raises(InvalidEventError, match=rf"episode_id='{eid}'.*{field}"):
        learner.consume(bad)
    for e in events[at:]:  # the corrected event, then the rest
        learner.consume(e)
    assert torch.equal(
        step_grad(learner, model), clean_gradient(model, events, streaming=streaming)
    )


@pytest.mark.parametrize("streaming", [False, True])
def test_an_out_of_vocab_id_does_not_wedge_the_learner(model, streaming):
    """The refused turn never reaches a backward pass; ending its episode as an infra failure
    lets the rest of the batch step, with the gradient of a batch where it failed."""
    events = [
        e
        for eid, reward in (("e0", 0.0), ("e1", 1.0), ("e2", 1.0), ("e3", 0.0))
        for e in episode(eid, reward, group_size=4)
    ]
    turn = first(events, ev.TurnCompleted, "e2")
    bad = dataclasses.replace(turn, action_ids=(vocab(model), 9))
    failed = [
        ev.RewardReady(episode_id="e2", reward=0.0, infra_failure=True)
        if isinstance(e, ev.RewardReady) and e.episode_id == "e2"
        else e
        for e in events
    ]
    learner = make(model, streaming=streaming)
    for e in failed:
        if e is turn:
            with pytest.raises(InvalidEventError, match=rf"'e2'.*action_ids\[0\]={vocab(model)}"):
                learner.consume(bad)
        else:
            learner.consume(e)
    expected = clean_gradient(model, failed, streaming=streaming)
    assert float(expected.norm()) > 0
    assert torch.equal(step_grad(learner, model), expected)


def test_a_refused_start_leaves_no_trace(model):
    learner = make(model)
    start = first(batch(), ev.EpisodeStarted, "e0")
    with pytest.raises(InvalidEventError, match="empty prompt_ids"):
        learner.consume(dataclasses.replace(start, prompt_ids=()))
    learner.consume(start)  # the group did not count the refused member
    learner.consume(first(batch(), ev.EpisodeStarted, "e1"))


def test_a_context_longer_than_the_model_takes_is_refused(model):
    limit = model.config.n_positions
    learner = make(model, streaming=True)
    events = episode(
        "e0", 0.0, prompt=(5,) * (limit - 3), actions=((8, 9), (11, 12, 13)), observations=((10,),)
    )
    start, turn0, tool0, turn1 = events[:4]
    for e in (start, turn0, tool0):  # limit - 1 tokens of context so far: fits
        learner.consume(e)
    with pytest.raises(InvalidEventError, match=rf"'e0'.*at least {limit + 3}.*{limit}"):
        learner.consume(turn1)  # 3 more action tokens, and observation 0 becomes context


def test_the_last_observation_is_not_context(model):
    limit = model.config.n_positions
    learner = make(model, streaming=True)
    long_tail = (10,) * 50
    events = episode(
        "e0", 0.0, prompt=(5,) * (limit - 2), actions=((8, 9),), observations=(long_tail,)
    )
    for e in events:  # the 50-token observation after the only action is never context
        learner.consume(e)
    for e in episode("e1", 1.0):
        learner.consume(e)
    learner.step()


def test_an_observation_becomes_context_when_a_later_turn_arrives(model):
    limit = model.config.n_positions
    learner = make(model)
    events = episode(
        "e0", 0.0, prompt=(5,) * (limit - 10), actions=((8, 9), (11,)), observations=((10,) * 20,)
    )
    start, turn0, tool0, turn1, done = events[:5]
    for e in (start, turn0, tool0):  # observation 0 may still be the last: accepted
        learner.consume(e)
    with pytest.raises(InvalidEventError, match="context"):
        learner.consume(turn1)
    with pytest.raises(InvalidEventError, match="context"):
        learner.consume(dataclasses.replace(done, num_turns=2))


@pytest.mark.parametrize("kind", [ev.ToolFinished, ev.TeacherScored])
def test_a_second_tool_result_or_teacher_score_for_a_turn_is_refused(model, kind):
    events = batch(teacher=True)
    learner = make(model, objective=OPD(), streaming=True)
    duplicate = first(events, kind)
    for e in events:
        learner.consume(e)
        if e is duplicate:
            with pytest.raises(EventOrderError, match=r"'e1'.*turn 0.*already"):
                learner.consume(e)
    learner.step()


@pytest.mark.parametrize("teacher_first", [True, False])
def test_short_teacher_logprobs_are_refused_in_sync_opd(model, teacher_first):
    events = batch(teacher=True)
    score = first(events, ev.TeacherScored)
    turn = first(events, ev.TurnCompleted)
    short = dataclasses.replace(score, teacher_logprobs=score.teacher_logprobs[:1])
    learner = make(model, objective=OPD(), streaming=False)
    for e in events[: events.index(turn)]:
        learner.consume(e)
    first_event, second = (short, turn) if teacher_first else (turn, short)
    learner.consume(first_event)
    with pytest.raises(EventOrderError, match="teacher_logprobs has 1 values.*2 tokens"):
        learner.consume(second)


def test_a_non_event_is_refused(model):
    with pytest.raises(InvalidEventError, match="expected a thundersync.events event"):
        make(model).consume({"episode_id": "e0", "reward": 1.0})


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(
    "value", [-1e308, -746.0, -(10**400), float("-inf")], ids=["-1e308", "-746", "-10**400", "-inf"]
)
def test_a_teacher_score_below_any_softmax_is_refused_naming_episode_turn_and_value(
    model, streaming, value
):
    """A teacher's −1e308 ("impossible") used to pass, and the step then dropped the whole
    batch with a non-finite gradient; now ``consume`` refuses it and the batch steps."""
    events = batch(teacher=True)
    good = first(events, ev.TeacherScored)
    bad = dataclasses.replace(good, teacher_logprobs=(-0.5, value))
    options = {"objective": OPD(), "streaming": streaming, "deterministic": True}  # bitwise
    learner = make(model, **options)
    at = events.index(good)
    for e in events[:at]:
        learner.consume(e)
    with pytest.raises(
        InvalidEventError,
        match=r"episode_id='e1', turn=0.*teacher_logprobs"
        r"\[1\]=-(1e\+308|746|1000|inf).*-745.13",
    ):
        learner.consume(bad)
    for e in events[at:]:
        learner.consume(e)
    expected = clean_gradient(model, events, **options)
    assert torch.equal(step_grad(learner, model), expected)


@pytest.mark.parametrize("reward", [Fraction(1), Decimal("1"), 1, Fraction(10**6)])
def test_an_int_fraction_or_decimal_reward_trains_as_its_float(model, reward):
    events = [
        dataclasses.replace(e, reward=reward)
        if isinstance(e, ev.RewardReady) and e.episode_id == "e1"
        else e
        for e in batch()
    ]
    as_float = [
        dataclasses.replace(e, reward=float(reward))
        if isinstance(e, ev.RewardReady) and e.episode_id == "e1"
        else e
        for e in batch()
    ]
    assert torch.equal(clean_gradient(model, events), clean_gradient(model, as_float))


@pytest.mark.parametrize("streaming", [False, True])
def test_a_sampler_logprob_at_the_floor_gives_finite_metrics(model, streaming):
    """−745 is accepted (a softmax in double can give it), and k3 = exp(d) − d − 1 then
    overflows: the metric is None, never inf or NaN."""
    events = [
        dataclasses.replace(e, action_logprobs=(-745.0,) * len(e.action_ids))
        if isinstance(e, ev.TurnCompleted)
        else e
        for e in batch()
    ]
    learner = make(model, streaming=streaming)
    for e in events:
        learner.consume(e)
    metrics = learner.step()
    numbers = [v for v in metrics.values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers)
    assert metrics["kl_sampler_learner"] is None
    assert metrics["logprob_mismatch_max"] > 700
