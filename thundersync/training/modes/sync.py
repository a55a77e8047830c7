"""Sync mode: roll out and grade the whole batch, then learn, step, sync the weights.

The learner idles while the batch rolls out (its slowest episode decides when learning can
start) and the engine idles while the learner computes: the baseline that streaming beats
without changing the update (docs/design.md §4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from thundersync.protocol import events as ev
from thundersync.training.modes.run import EventLearner, Run


@dataclass(frozen=True, slots=True)
class SyncMode:
    """One batch in flight, learned from once it is complete."""

    name: ClassVar[str] = "sync"
    batches_in_flight: ClassVar[int] = 1
    starts_backward_before_step: ClassVar[bool] = False

    def learner_options(self) -> dict[str, Any]:
        return {"streaming": False}  # the learner collects the batch and computes at step()

    def objective_problem(self, algo: str, tis_cap: float | None) -> str | None:
        return None

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
