"""The episode's key and record (thundersync/protocol/episode.py; docs/design.md §2)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from thundersync import events as ev
from thundersync.protocol.episode import EpisodeKey, EpisodeRecord, step_of


@given(st.one_of(st.none(), st.integers(0, 10**6)), st.integers(0, 10**4), st.integers(0, 10**4))
def test_an_episode_id_parses_back_to_its_key(step, group, sample):
    key = EpisodeKey(step, group, sample)
    assert EpisodeKey.parse(key.episode_id) == key
    assert key.episode_id.startswith(key.group_id + "-e")
    assert step_of(key.episode_id) == step


def test_ids_keep_the_run_folder_format():
    assert EpisodeKey(3, 1, 0).episode_id == "s3-g1-e0"  # as in events.jsonl since 0.1
    assert EpisodeKey(None, 2, 5).episode_id == "v-g2-e5"
    assert [k.episode_id for k in EpisodeKey.batch(0, 2, 2)] == [
        "s0-g0-e0",
        "s0-g0-e1",
        "s0-g1-e0",
        "s0-g1-e1",
    ]


def test_any_other_id_has_no_key():
    for other in ["", "e0", "g0-e1", "s-g0-e0", "s1-g0", "s1-g0-e0-x", "x1-g0-e0", "s01x-g0-e0"]:
        assert EpisodeKey.parse(other) is None, other
        assert step_of(other) is None


def test_a_record_folds_events_in_any_order_and_gives_them_back_in_causal_order():
    eid = "s0-g0-e0"
    started = ev.EpisodeStarted(
        episode_id=eid,
        group_id="s0-g0",
        group_size=1,
        task_id="t",
        prompt_ids=(1, 2),
        policy_version=0,
    )
    turns = [
        ev.TurnCompleted(
            episode_id=eid, turn=k, action_ids=(3 + k,), action_logprobs=(-0.5,), policy_version=0
        )
        for k in range(2)
    ]
    tool = ev.ToolFinished(
        episode_id=eid, turn=0, observation_ids=(9, 9), duration_s=0.1, exit_code=0, timed_out=False
    )
    done = ev.EpisodeCompleted(episode_id=eid, num_turns=2, stop_reason="submitted")
    reward = ev.RewardReady(episode_id=eid, reward=1.0, details={"tests": 3})
    record = EpisodeRecord(eid)
    for event in [reward, turns[1], done, tool, turns[0]]:
        assert record.fold(event)
        assert not record.complete
    assert not record.turn_ready(0)  # nothing is ready before the prompt is known
    record.fold(started)
    assert record.complete and record.tokens_ready and record.num_turns == 2
    assert record.events() == [started, turns[0], tool, turns[1], done, reward]
    trajectory = record.trajectory()
    assert (
        trajectory.turns[0].observation_ids == (9, 9) and trajectory.turns[1].observation_ids == ()
    )
    assert (trajectory.reward, trajectory.stop_reason, trajectory.details) == (
        1.0,
        "submitted",
        {"tests": 3},
    )
    assert not record.fold(ev.StepFinished(step=1, policy_version=1))
