"""Sync mode: roll out and grade the whole batch, then learn, step, sync the weights.

The learner idles while the batch rolls out (its slowest episode decides when learning can
start) and the engine idles while the learner computes: the baseline that streaming beats
without changing the update (docs/design.md §4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from thundersync.core.contract import LearnerContract, OnBatch
from thundersync.protocol import events as ev
from thundersync.training.modes.run import EventLearner, Run


@dataclass(frozen=True, slots=True)
class SyncMode:
    """One batch in flight, learned from once it is complete."""

    name: ClassVar[str] = "sync"
    batches_in_flight: ClassVar[int] = 1
    starts_backward_before_step: ClassVar[bool] = False
    baseline: ClassVar[bool] = True
    exact: ClassVar[bool] = True
    label_forms: ClassVar[str] = "sync"

    @property
    def label(self) -> str:
        return self.name

    @classmethod
    def from_label(cls, label: str, *, staleness: int) -> SyncMode | None:
        return cls() if label == cls.name else None

    def train_fields(self) -> dict[str, Any]:
        return {"mode": self.name}

    def learner_contract(self) -> LearnerContract:
        return OnBatch()  # the learner collects the batch and computes at step()

    def learn(self, learner: EventLearner, events: Sequence[ev.Event]) -> None:
        for event in events:
            learner.consume(event)

    def run(self, run: Run) -> list[dict[str, Any]]:
        history = []
        for step in run.steps():
            # --- roll out the whole batch with the current weights, and grade it ---
            run.submit(step)
            events = run.wait_batch(step)

            # --- then learn from all of it at once: one batched backward, one step ---
            self.learn(run.learner, events)
            history.append(run.finish_step(step))  # new weights before the next batch starts
        return history
