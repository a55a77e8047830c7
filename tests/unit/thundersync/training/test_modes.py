"""Each training mode, driven over a scripted run: what it submits, when it learns, what the
learner is handed, and the options it gives every learner rank (docs/design.md §4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from thundersync import GRPO, OPD
from thundersync import events as ev
from thundersync.training.config import TrainConfig
from thundersync.training.modes import (
    Arrivals,
    AsyncMode,
    Mode,
    Run,
    StreamingMode,
    SyncMode,
    choose_mode,
)


@dataclass
class ScriptedLearner:
    calls: list[str]
    holds: list[float | None] = field(default_factory=list)
    """What ``wake_after`` answers, in turn (then None: nothing held)."""

    def consume(self, event: ev.Event) -> None:
        self.calls.append(f"consume {event.episode_id}")

    def drain(self) -> None:
        self.calls.append("drain")

    def wake_after(self) -> float | None:
        return self.holds.pop(0) if self.holds else None


@dataclass
class ScriptedRun:
    """A run whose batch ``s`` arrives in ``arrivals_per_batch`` pieces of one reward each."""

    num_steps: int
    arrivals_per_batch: int = 2
    calls: list[str] = field(default_factory=list)
    arrived: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._learner = ScriptedLearner(self.calls)

    @property
    def learner(self) -> ScriptedLearner:
        return self._learner

    def steps(self) -> range:
        return range(self.num_steps)

    def submit(self, step: int) -> None:
        self.calls.append(f"submit {step}")

    def _reward(self, step: int, i: int) -> ev.Event:
        return ev.RewardReady(t=0.0, episode_id=f"s{step}-g0-e{i}", reward=1.0)

    def wait_batch(self, step: int) -> list[ev.Event]:
        self.calls.append(f"wait {step}")
        return [self._reward(step, i) for i in range(self.arrivals_per_batch)]

    def arrivals(self, step: int, timeout_s: float | None = None) -> Arrivals:
        if timeout_s is not None:  # a hold runs out before anything arrives
            self.calls.append(f"arrivals {step} within {timeout_s:g} s: none")
            return Arrivals([], False)
        i = self.arrived[step] = self.arrived.get(step, -1) + 1
        self.calls.append(f"arrivals {step}")
        return Arrivals([self._reward(step, i)], i + 1 == self.arrivals_per_batch)

    def finish_step(self, step: int) -> dict[str, Any]:
        self.calls.append(f"finish {step}")
        return {"step": step + 1}


def _run(mode: Mode, num_steps: int) -> tuple[list[str], list[dict[str, Any]]]:
    run: Run = ScriptedRun(num_steps)
    history = mode.run(run)
    return run.calls, history  # type: ignore[attr-defined]


def test_sync_learns_from_the_whole_batch_then_steps():
    calls, history = _run(SyncMode(), 2)
    one = ["wait {s}", "consume s{s}-g0-e0", "consume s{s}-g0-e1", "finish {s}"]
    assert calls == [c.format(s=s) for s in (0, 1) for c in [f"submit {s}", *one]]
    assert history == [{"step": 1}, {"step": 2}]


def test_async_keeps_k_batches_ahead_of_the_learner():
    calls, history = _run(AsyncMode(2), 4)
    submits = [i for i, c in enumerate(calls) if c.startswith("submit")]
    finishes = {c: i for i, c in enumerate(calls) if c.startswith("finish")}
    assert calls[:3] == ["submit 0", "submit 1", "submit 2"]  # 1 + k before any learning
    assert calls.index("submit 3") > finishes["finish 0"]  # batch 3 after θ_1 exists
    assert len(submits) == 4 and len(history) == 4
    assert "drain" not in calls  # the learner computes at the step


def test_streaming_learns_each_arrival_while_the_batch_rolls_out():
    calls, history = _run(StreamingMode(), 1)
    assert calls == [
        "submit 0",
        "arrivals 0",
        "consume s0-g0-e0",
        "drain",
        "arrivals 0",
        "consume s0-g0-e1",
        "drain",
        "finish 0",
    ]
    assert history == [{"step": 1}]


def test_streaming_wakes_the_learner_when_its_held_work_must_run():
    run = ScriptedRun(1)
    run.learner.holds = [None, 0.25]  # the first arrival's work is held for 0.25 s
    StreamingMode().run(run)
    assert run.calls == [
        "submit 0",
        "arrivals 0",
        "consume s0-g0-e0",
        "drain",
        "arrivals 0 within 0.25 s: none",
        "drain",  # nothing arrived: the held work runs now
        "arrivals 0",
        "consume s0-g0-e1",
        "drain",
        "finish 0",
    ]


@pytest.mark.parametrize(
    ("name", "streams", "lag", "in_flight", "early"),
    [
        ("sync", False, None, 1, False),
        ("async", False, 3, 4, False),
        ("streaming", True, 0, 1, True),
    ],
)
def test_each_mode_holds_its_learner_contract_and_pipeline_depth(
    name, streams, lag, in_flight, early
):
    mode = TrainConfig(mode=name, staleness=3).training_mode()
    assert mode.name == name
    contract = mode.learner_contract()
    assert contract.streams is streams
    accepted = contract.accepted_lag()
    assert (accepted and accepted[0]) == lag
    assert mode.batches_in_flight == in_flight
    assert mode.starts_backward_before_step is early


def test_a_rank_hands_events_to_the_mode_as_the_main_learner_does():
    learned: list[str] = []
    learner = ScriptedLearner(learned)
    events: Sequence[ev.Event] = [ev.RewardReady(t=0.0, episode_id="s0-g0-e0", reward=0.0)]
    StreamingMode().learn(learner, events)
    SyncMode().learn(learner, events)
    assert learned == ["consume s0-g0-e0", "drain", "consume s0-g0-e0"]


def test_only_async_refuses_an_objective_and_an_unknown_mode_is_named():
    async_terms = AsyncMode(1).learner_contract()
    assert async_terms.problem(OPD())
    assert async_terms.problem(GRPO(tis_cap=2.0))
    assert async_terms.problem(GRPO()) is None
    assert StreamingMode().learner_contract().problem(OPD()) is None
    assert SyncMode().learner_contract().problem(GRPO(tis_cap=2.0)) is None
    with pytest.raises(ValueError, match=r"unknown mode 'fast'; expected one of \['async'"):
        choose_mode("fast", staleness=1)
    with pytest.raises(ValueError, match=r"OPD has no off-policy correction"):
        TrainConfig(mode="async", algo="opd", teacher="t")
