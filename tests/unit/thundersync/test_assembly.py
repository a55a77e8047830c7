"""Assembly rejects events that would make streaming and sync disagree, naming what is wrong."""

from __future__ import annotations

import pytest
import torch

from thundersync import GRPO, OPD, Learner
from thundersync import events as ev
from thundersync.core.assembly import Assembler, EventOrderError, natural_key
from thundersync.models import load_model
from thundersync.protocol.errors import InvalidEventError


def start(eid: str, gid: str = "g", size: int = 2, prompt=(5, 6)) -> ev.EpisodeStarted:
    return ev.EpisodeStarted(
        episode_id=eid,
        group_id=gid,
        group_size=size,
        task_id="t",
        prompt_ids=prompt,
        policy_version=0,
    )


def turn(eid: str, k: int) -> ev.TurnCompleted:
    return ev.TurnCompleted(
        episode_id=eid, turn=k, action_ids=(7, 8), action_logprobs=(-1.0,) * 2, policy_version=0
    )


def test_every_member_of_a_group_must_agree_on_its_size():
    a = Assembler()
    a.apply(start("e0", size=2))
    with pytest.raises(EventOrderError, match="group_size=3.*group_size=2"):
        a.apply(start("e1", size=3))


def test_a_group_takes_no_more_members_than_its_size():
    a = Assembler()
    a.apply(start("e0"))
    a.apply(start("e1"))
    with pytest.raises(EventOrderError, match="already has its 2 episodes"):
        a.apply(start("e2"))


@pytest.mark.parametrize("completed_first", [True, False])
def test_a_turn_beyond_num_turns_is_rejected_in_either_order(completed_first):
    a = Assembler()
    a.apply(start("e0"))
    done = ev.EpisodeCompleted(episode_id="e0", num_turns=1, stop_reason="x")
    a.apply(turn("e0", 0))
    with pytest.raises(EventOrderError, match="turn"):
        if completed_first:
            a.apply(done)
            a.apply(turn("e0", 1))
        else:
            a.apply(turn("e0", 1))
            a.apply(done)


def test_an_empty_prompt_is_rejected():
    with pytest.raises(InvalidEventError, match="empty prompt_ids"):
        Assembler().apply(start("e0", prompt=()))


def test_an_episode_without_actions_must_be_an_infra_failure():
    a = Assembler()
    a.apply(start("e0"))
    a.apply(ev.EpisodeCompleted(episode_id="e0", num_turns=0, stop_reason="error"))
    with pytest.raises(EventOrderError, match="0 turns must be an infra failure"):
        a.apply(ev.RewardReady(episode_id="e0", reward=0.0))


def test_natural_order_is_total_and_numeric():
    ids = ["g10", "g2", "g01", "g1", "a", "1a", "a1"]
    ordered = sorted(ids, key=natural_key)
    assert ordered.index("g2") < ordered.index("g10")
    assert sorted(reversed(ids), key=natural_key) == ordered  # ties never fall to arrival order


@pytest.mark.parametrize("objective", [GRPO(), OPD()])
def test_an_infra_failure_before_the_first_action_is_consumed_and_excluded(
    tiny_model_dirs, objective
):
    model = load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)
    learner = Learner(model, objective, torch.optim.SGD(model.parameters(), lr=0.0), streaming=True)
    for event in [
        start("ok", size=2),
        turn("ok", 0),
        ev.TeacherScored(episode_id="ok", turn=0, teacher_logprobs=(-0.5, -0.5)),
        ev.EpisodeCompleted(episode_id="ok", num_turns=1, stop_reason="submitted"),
        ev.RewardReady(episode_id="ok", reward=1.0),
        start("dead", size=2),
        ev.EpisodeCompleted(episode_id="dead", num_turns=0, stop_reason="error"),
        ev.RewardReady(episode_id="dead", reward=0.0, infra_failure=True),
    ]:
        learner.consume(event)
    metrics = learner.step()
    assert metrics["num_tokens"] == 2


def test_deterministic_streaming_frees_a_dropped_groups_pieces(tiny_model_dirs):
    model = load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)
    learner = Learner(
        model,
        GRPO(dynamic_sampling=True),
        torch.optim.SGD(model.parameters(), lr=0.0),
        streaming=True,
        deterministic=True,
    )
    for eid in ("e0", "e1"):
        for event in [
            start(eid),
            turn(eid, 0),
            ev.EpisodeCompleted(episode_id=eid, num_turns=1, stop_reason="x"),
            ev.RewardReady(episode_id=eid, reward=1.0),
        ]:
            learner.consume(event)
    assert learner.pool.bytes_in_use == 0
