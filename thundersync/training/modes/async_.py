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

from thundersync.protocol import events as ev
from thundersync.training.modes.run import EventLearner, Run


@dataclass(frozen=True, slots=True)
class AsyncMode:
    """Up to ``1 + staleness`` batches in flight; each learned from once it is complete."""

    staleness: int
    """k >= 1: how many versions behind the learner a sampled token may be."""
    name: ClassVar[str] = "async"
    starts_backward_before_step: ClassVar[bool] = False

    @property
    def batches_in_flight(self) -> int:
        return 1 + self.staleness

    def learner_options(self) -> dict[str, Any]:
        # the learner accepts tokens up to k versions old, and reports their staleness
        return {"streaming": False, "max_staleness": self.staleness}

    def objective_problem(self, algo: str, tis_cap: float | None) -> str | None:
        if algo == "grpo" and tis_cap is None:
            return None
        return (
            "async trains GRPO without tis_cap (its PPO ratio already corrects for the "
            "sampler; OPD has no off-policy correction)"
        )

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
