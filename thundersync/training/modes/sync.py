"""Sync mode: roll out and grade the whole batch, then learn, step, sync the weights.

The learner idles while the batch rolls out (its slowest episode decides when learning can
start) and the engine idles while the learner computes: the baseline that streaming beats
without changing the update (docs/design.md §4).
"""

from __future__ import annotations

from typing import Any


def run(trainer: Any) -> list[dict[str, Any]]:
    learner = trainer.learner
    for step in trainer.steps():
        # --- roll out the whole batch with the current weights, and grade it ---
        trainer.submit(step)
        events = trainer.wait_batch(step)

        # --- then learn from all of it at once: one batched backward, one step ---
        for event in events:
            learner.consume(event)
        trainer.finish_step(step)  # also sends the new weights before the next batch starts
    return trainer.history
