"""Async mode (bounded staleness k): rollout never waits for the learner.

Batch n may be sampled with weights as old as θ_{n−k}: batches n+1 … n+k roll out while the
learner trains on batch n, and the engine picks up new weights between generation calls, so
one episode can mix versions. The learner takes its PPO ratio against the behaviour
log-probs (the sampler's), so ``clip_low``/``clip_high`` act (decoupled PPO clip), and reports
a staleness histogram per step. Faster per step than sync, but it trains on stale tokens,
which streaming never does (docs/design.md §4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from thundersync.core.contract import BoundedStaleness, LearnerContract
from thundersync.protocol import events as ev
from thundersync.training.modes.run import EventLearner, Run


@dataclass(frozen=True, slots=True)
class AsyncMode:
    """Up to ``1 + staleness`` batches in flight; each learned from once it is complete."""

    staleness: int
    """k >= 1: how many versions behind the learner a sampled token may be."""
    name: ClassVar[str] = "async"
    starts_backward_before_step: ClassVar[bool] = False
    baseline: ClassVar[bool] = False
    exact: ClassVar[bool] = False
    label_forms: ClassVar[str] = "async (with --staleness) or async-k<K>"

    @property
    def batches_in_flight(self) -> int:
        return 1 + self.staleness

    @property
    def label(self) -> str:
        return f"{self.name}-k{self.staleness}"

    @classmethod
    def from_label(cls, label: str, *, staleness: int) -> AsyncMode | None:
        """``async`` (with ``staleness``) or ``async-k<K>``."""
        name, _, k = label.partition("-k")
        if name != cls.name or (k and not (k.isdigit() and int(k) >= 1)):
            return None
        return cls(int(k) if k else staleness)

    def train_fields(self) -> dict[str, Any]:
        return {"mode": self.name, "staleness": self.staleness}

    def learner_contract(self) -> LearnerContract:
        # the learner accepts tokens up to k versions old, and reports their staleness
        return BoundedStaleness(self.staleness)

    def learn(self, learner: EventLearner, events: Sequence[ev.Event]) -> None:
        for event in events:
            learner.consume(event)

    def run(self, run: Run) -> list[dict[str, Any]]:
        k, history = self.staleness, []
        steps = run.steps()
        # --- fill the pipeline: batches step .. step+k may use the current weights ---
        for step in steps[: k + 1]:
            run.submit(step)
        for step in steps:
            # --- learn from the oldest batch as soon as it is complete ---
            self.learn(run.learner, run.wait_batch(step))
            history.append(run.finish_step(step))  # new weights reach the engine between batches
            # --- batch step+k+1 may be sampled with weights ≥ θ_{step+1}: start it now ---
            if step + k + 1 in steps:
                run.submit(step + k + 1)
        return history
