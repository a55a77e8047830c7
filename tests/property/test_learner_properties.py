"""Properties of the streaming learner: exact zeros, the memory budget, event round-trips."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.property import textbook
from thundersync import GRPO, Learner
from thundersync import events as ev
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.models import load_model


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)


def run(model, objective, events, **kwargs) -> tuple[torch.Tensor, Learner, dict]:
    learner = Learner(
        model,
        objective,
        torch.optim.SGD(model.parameters(), lr=0.0),
        max_grad_norm=None,
        **kwargs,
    )
    for event in events:
        learner.consume(event)
    metrics = learner.step()
    return step_grad(model), learner, metrics


def step_grad(model) -> torch.Tensor:
    """The step's gradient as the optimizer saw it: every parameter's ``.grad``, flattened
    (SGD with lr 0 and no clipping leave the model and the gradient as they were)."""
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])


def graded_last(events: list[ev.Event]) -> list[ev.Event]:
    """``events`` with every reward moved after every other event, in their order (long
    grading: each episode completes before the first reward)."""
    rewards = [e for e in events if isinstance(e, ev.RewardReady)]
    return [e for e in events if not isinstance(e, ev.RewardReady)] + rewards


def flat_group(model, reward: float, size: int, seed: int) -> list[ev.Event]:
    """One group whose rewards are all ``reward``."""
    events = random_batch(
        seed,
        model.config.vocab_size,
        BatchShape(
            max_groups=1, max_group_size=size, max_turns=3, max_tokens=48, infra_failure_rate=0.0
        ),
    )
    return [
        ev.RewardReady(episode_id=e.episode_id, reward=reward)
        if isinstance(e, ev.RewardReady)
        else e
        for e in events
    ]


@given(
    reward=st.sampled_from([0.0, 1.0, 0.1, 0.3, 1e-9, 7.77]),
    seed=st.integers(0, 10**6),
    options=st.sampled_from(
        [{}, {"early_start": True}, {"buffer_budget_bytes": 0}, {"deterministic": True}]
    ),
    scale=st.booleans(),
)
def test_an_all_equal_group_contributes_exactly_zero(model, reward, seed, options, scale):
    # 0.1 and 0.3: the mean of equal floats is not always the value itself (0.1*3/3 != 0.1),
    # so r - mean(r) would leave a residue; sync and streaming must both give exact zeros.
    events = flat_group(model, reward, size=4, seed=seed)
    for streaming in (False, True):
        grad, _, _ = run(model, GRPO(scale_by_std=scale), events, streaming=streaming, **options)
        assert torch.count_nonzero(grad) == 0


@given(
    seed=st.integers(0, 10**6),
    budget_buffers=st.integers(0, 5),
    early_start=st.booleans(),
    kl=st.sampled_from([0.0, 0.1]),
    deterministic=st.booleans(),
)
def test_open_group_memory_never_exceeds_the_budget_and_stays_exact(
    model, tiny_model_dirs, seed, budget_buffers, early_start, kl, deterministic
):
    reference = load_model(tiny_model_dirs["gpt2"], dtype=torch.float64) if kl else None
    objective = GRPO(kl_coef=kl)
    shape = BatchShape(max_groups=4, max_group_size=5, max_turns=3, max_tokens=48)
    events = random_batch(seed, model.config.vocab_size, shape)
    numel = sum(p.numel() for p in model.parameters())
    budget = budget_buffers * numel * 8
    grad, learner, metrics = run(
        model,
        objective,
        events,
        streaming=True,
        early_start=early_start,
        buffer_budget_bytes=budget,
        reference=reference,
        deterministic=deterministic,
    )
    assert metrics["peak_buffer_bytes"] <= budget
    book = textbook.gradient(model, objective, events, reference)
    assert float((grad - book).norm()) <= 1e-12 * max(float(book.norm()), 1e-300)


@given(
    seed=st.integers(0, 10**6),
    drains=st.lists(st.integers(0, 400), max_size=8),
    early_start=st.booleans(),
    opd=st.booleans(),
    seconds_per_token=st.sampled_from([None, 1e-9, 1e-4, 1e3]),
    rewards_last=st.booleans(),
)
def test_draining_at_any_points_stays_exact(
    model, seed, drains, early_start, opd, seconds_per_token, rewards_last
):
    """A worker drains whenever its inbox runs dry: at arbitrary points of the stream. With
    a pace (``thundersync.core.holds``), deposits are held for their group's close and
    released by the close, by the clock or at the step; the step is the textbook's."""
    from thundersync import OPD

    objective = OPD(granularity="turn") if opd else GRPO()
    shape = BatchShape(max_groups=3, max_group_size=4, max_turns=3, max_tokens=48)
    events = random_batch(seed, model.config.vocab_size, shape, teacher=opd)
    if rewards_last:  # every group's members complete before its rewards: holds happen
        events = graded_last(events)
    kwargs = {} if opd else {"early_start": early_start}
    learner = Learner(
        model,
        objective,
        torch.optim.SGD(model.parameters(), lr=0.0),
        streaming=True,
        eager=False,
        hold_deposits=seconds_per_token is not None,
        max_grad_norm=None,
        **kwargs,
    )
    if learner.pace is not None:
        learner.pace.seconds_per_token = seconds_per_token
    for i, event in enumerate(events):
        learner.consume(event)
        if i in drains or learner.wake_after() == 0.0:
            learner.drain()
    learner.step()
    book = textbook.gradient(model, objective, events)
    assert float((step_grad(model) - book).norm()) <= 1e-12 * max(float(book.norm()), 1e-300)


@given(
    seed=st.integers(0, 10**6),
    kl=st.sampled_from([0.0, 0.1]),
    scale=st.booleans(),
    rewards_last=st.booleans(),
)
def test_early_start_without_a_budget_holds_two_buffers_per_group_and_one_more(
    model, tiny_model_dirs, seed, kl, scale, rewards_last
):
    """Early start needs no buffer per trajectory: what does not depend on the reward runs at
    completion into the group's accumulators, the rest at the reward. Its peak stays within
    (2 · groups + 1) parameter copies, and the step is the textbook's."""
    reference = load_model(tiny_model_dirs["gpt2"], dtype=torch.float64) if kl else None
    objective = GRPO(kl_coef=kl, scale_by_std=scale)
    shape = BatchShape(max_groups=3, max_group_size=6, max_turns=2, max_tokens=40)
    events = random_batch(seed, model.config.vocab_size, shape)
    if rewards_last:  # long grading: every episode completes before the first reward
        events = graded_last(events)
    groups = {e.group_id for e in events if isinstance(e, ev.EpisodeStarted)}
    grad, _, metrics = run(
        model, objective, events, streaming=True, early_start=True, reference=reference
    )
    assert metrics["peak_buffer_bytes"] <= (2 * len(groups) + 1) * metrics["buffer_bytes"]
    book = textbook.gradient(model, objective, events, reference)
    assert float((grad - book).norm()) <= 1e-12 * max(float(book.norm()), 1e-300)


def test_an_unlimited_budget_really_holds_groups_open(model):
    """The budget test above must be able to fail: without a budget, buffers are used."""
    shape = BatchShape(
        max_groups=3, max_group_size=4, max_turns=2, max_tokens=40, infra_failure_rate=0.0
    )
    events = random_batch(11, model.config.vocab_size, shape, arrival="interleaved")
    _, _, metrics = run(model, GRPO(), events, streaming=True, early_start=True)
    assert metrics["peak_buffer_bytes"] >= 2 * metrics["buffer_bytes"]


token_ids = st.lists(st.integers(0, 2**31 - 1), max_size=20).map(tuple)
logprobs = st.lists(st.floats(max_value=0.0, allow_nan=False), max_size=20).map(tuple)
names = st.text(min_size=1, max_size=12)
any_event = st.one_of(
    st.builds(
        ev.EpisodeStarted,
        episode_id=names,
        group_id=names,
        group_size=st.integers(1, 64),
        task_id=names,
        prompt_ids=token_ids,
        policy_version=st.integers(0, 10**6),
    ),
    st.builds(
        ev.TurnCompleted,
        episode_id=names,
        turn=st.integers(0, 99),
        action_ids=token_ids,
        action_logprobs=logprobs,
        policy_version=st.integers(0, 10**6),
    ),
    st.builds(
        ev.ToolFinished,
        episode_id=names,
        turn=st.integers(0, 99),
        observation_ids=token_ids,
        duration_s=st.floats(0, 1e4),
        exit_code=st.none() | st.integers(-255, 255),
        timed_out=st.booleans(),
    ),
    st.builds(
        ev.EpisodeCompleted, episode_id=names, num_turns=st.integers(1, 99), stop_reason=names
    ),
    st.builds(
        ev.RewardReady,
        episode_id=names,
        reward=st.floats(-1e6, 1e6),
        infra_failure=st.booleans(),
        details=st.dictionaries(names, st.integers()),
    ),
    st.builds(
        ev.TeacherScored, episode_id=names, turn=st.integers(0, 99), teacher_logprobs=logprobs
    ),
)


@given(event=any_event)
def test_events_round_trip_through_json(event):
    assert ev.from_dict(json.loads(json.dumps(ev.to_dict(event)))) == event


@given(events=st.lists(any_event, max_size=10))
def test_the_jsonl_log_holds_lengths_not_token_arrays(tmp_path_factory, events):
    path = tmp_path_factory.mktemp("log") / "events.jsonl"
    with ev.JsonlSink(path) as sink:
        for event in events:
            sink(event)
    records = ev.read_jsonl(path)
    assert [r["event"] for r in records] == [type(e).__name__ for e in events]
    for record, event in zip(records, events):
        for name in ("prompt_ids", "action_ids", "observation_ids", "teacher_logprobs"):
            if hasattr(event, name):
                assert name not in record
                assert record[f"{name}_len"] == len(getattr(event, name))


@given(
    seed=st.integers(0, 10**6),
    drains=st.lists(st.integers(0, 400), max_size=8),
    opd=st.booleans(),
    budget_buffers=st.sampled_from([None, 0, 2]),
)
def test_deterministic_streaming_drained_at_any_points_is_bitwise_sync(
    model, seed, drains, opd, budget_buffers
):
    """What a training loop does (``eager=False``, ``drain()`` when its inbox runs dry) keeps
    deterministic streaming bitwise equal to deterministic sync, within any budget."""
    from thundersync import OPD

    objective = OPD(granularity="turn") if opd else GRPO(kl_coef=0.0)
    shape = BatchShape(max_groups=3, max_group_size=4, max_turns=3, max_tokens=48)
    events = random_batch(seed, model.config.vocab_size, shape, teacher=opd)
    numel = sum(p.numel() for p in model.parameters())
    budget = None if budget_buffers is None else budget_buffers * numel * 8
    sync, _, _ = run(model, objective, events, deterministic=True)
    sync = sync.clone()
    learner = Learner(
        model,
        objective,
        torch.optim.SGD(model.parameters(), lr=0.0),
        streaming=True,
        deterministic=True,
        eager=False,
        max_grad_norm=None,
        buffer_budget_bytes=budget,
    )
    for i, event in enumerate(events):
        learner.consume(event)
        if i in drains:
            learner.drain()
    learner.step()
    assert torch.equal(step_grad(model), sync)


huge_reals = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**400), 10**400),
    st.fractions(max_denominator=10**6).map(lambda f: f * 10**310),  # beyond float range
)


@given(reward=huge_reals)
def test_a_reward_is_accepted_exactly_when_its_float_is_finite_and_in_range(reward):
    """Validation is total: any real number is either taken or an ``InvalidEventError``,
    never an ``OverflowError`` (``math.isfinite(10**400)`` raises one)."""
    import math

    from thundersync import InvalidEventError
    from thundersync.core.validation import MAX_ABS_REWARD, EventLimits, check_event

    event = ev.RewardReady(episode_id="e0", reward=reward)
    try:
        fits = math.isfinite(float(reward)) and abs(float(reward)) <= MAX_ABS_REWARD
    except OverflowError:
        fits = False
    if fits:
        check_event(event, EventLimits())
    else:
        with pytest.raises(InvalidEventError, match="e0.*reward"):
            check_event(event, EventLimits())
