"""Streaming mode (ThunderSync): zero staleness, and each piece of gradient work starts as soon
as its inputs are fixed.

Batch n is rolled out with θₙ only. While it rolls out, the learner consumes its events as
they arrive — a GRPO trajectory's backward at its reward (or at ``EpisodeCompleted`` with
``early_start``), an OPD turn's at its teacher score, while the turn's tool call still runs —
and folds them exactly (docs/design.md §3). When the last reward arrives only the tail is left:
fold, one optimizer step, weights to the engine, next batch. The update equals sync's.

The loop drains what has queued and computes it as one micro-batch rather than one backward
per event, which keeps the learner's share of the step near the bound T* (docs/design.md §4
has the measurements). Data-parallel ranks do the same with the events forwarded to them. A
deposit into a group about to close may be held for a while (``thundersync.core.holds``): the
loop then wakes the learner when the hold runs out even if nothing arrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from thundersync.core.contract import LearnerContract, Streaming
from thundersync.protocol import events as ev
from thundersync.training.modes.run import EventLearner, Run


@dataclass(frozen=True, slots=True)
class StreamingMode:
    """One batch in flight, learned from while it rolls out."""

    name: ClassVar[str] = "streaming"
    batches_in_flight: ClassVar[int] = 1
    starts_backward_before_step: ClassVar[bool] = True
    baseline: ClassVar[bool] = False
    exact: ClassVar[bool] = True
    label_forms: ClassVar[str] = "streaming"

    @property
    def label(self) -> str:
        return self.name

    @classmethod
    def from_label(cls, label: str, *, staleness: int) -> StreamingMode | None:
        return cls() if label == cls.name else None

    def train_fields(self) -> dict[str, Any]:
        return {"mode": self.name}

    def learner_contract(self) -> LearnerContract:
        # the learner starts each piece of work when its inputs are fixed, and refuses a
        # token of another policy version (zero staleness)
        return Streaming()

    def learn(self, learner: EventLearner, events: Sequence[ev.Event]) -> None:
        for event in events:
            learner.consume(event)
        learner.drain()  # the work they unblocked, as one micro-batch

    def run(self, run: Run) -> list[dict[str, Any]]:
        history = []
        for step in run.steps():
            run.submit(step)
            while True:
                # --- take everything that has arrived (blocking until something does, or
                # until work the learner holds back must run: thundersync.core.holds) ---
                arrived = run.arrivals(step, run.learner.wake_after())
                # --- compute the work it unblocked, batched, while rollout goes on ---
                self.learn(run.learner, arrived.events)
                if arrived.is_complete:
                    break
            history.append(run.finish_step(step))
        return history
