"""Async mode (bounded staleness k): rollout never waits for the learner.

Batch n may be sampled with weights as old as θ_{n−k}: batches n+1 … n+k roll out while the
learner trains on batch n, and the engine picks up new weights between generation calls, so
one episode can mix versions. The learner takes its PPO ratio against the behaviour
log-probs (the sampler's), so ``clip_low``/``clip_high`` act (decoupled PPO clip), and reports
a staleness histogram per step. Faster per step than sync, but it trains on stale tokens,
which streaming never does (docs/design.md §4).
"""

from __future__ import annotations

from typing import Any


def run(trainer: Any) -> list[dict[str, Any]]:
    learner, k = trainer.learner, trainer.config.staleness
    steps = trainer.steps()
    # --- fill the pipeline: batches step .. step+k may use the current weights ---
    for step in steps[: k + 1]:
        trainer.submit(step)
    for step in steps:
        # --- learn from the oldest batch as soon as it is complete ---
        for event in trainer.wait_batch(step):
            learner.consume(event)
        trainer.finish_step(step)  # the new weights reach the engine between two batches
        # --- batch step+k+1 may be sampled with weights ≥ θ_{step+1}: start it now ---
        if step + k + 1 in steps:
            trainer.submit(step + k + 1)
    return trainer.history
