"""Accuracy curves of training runs and what the comparison reads off them.

A curve is the held-out accuracy of a run's checkpoints against the run's *training* clock
(seconds since its workers were ready, evaluation excluded: checkpoints are evaluated after
the run, so evaluation never competes with training) and against its step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Point:
    """One evaluated checkpoint: after ``step`` optimizer steps, at ``time_s`` of training."""

    step: int
    time_s: float
    accuracy: float


def time_to_target(curve: Sequence[Point], target: float) -> float | None:
    """Training seconds at the first checkpoint whose accuracy reaches ``target`` (None:
    never within the run)."""
    for point in sorted(curve, key=lambda p: p.step):
        if point.accuracy >= target:
            return point.time_s
    return None


def accuracy_at_budget(curve: Sequence[Point], budget_s: float) -> float | None:
    """Accuracy of the last checkpoint saved within ``budget_s`` of training (what a user who
    stops at the budget would have); None when no checkpoint fits."""
    within = [p for p in curve if p.time_s <= budget_s + 1e-9]
    return max(within, key=lambda p: p.step).accuracy if within else None


def area_under_curve(curve: Sequence[Point], budget_s: float) -> float | None:
    """The area under the accuracy-vs-time curve from 0 to ``budget_s``, over ``budget_s``:
    the run's mean accuracy over its first ``budget_s`` of training (each checkpoint's accuracy
    holds until the next one's; before the first, 0). A mode that gets there sooner has more
    area, and every checkpoint counts, not one crossing or one instant. None when no
    checkpoint fits (or the budget is not positive)."""
    within = sorted((p for p in curve if p.time_s <= budget_s + 1e-9), key=lambda p: p.step)
    if not within or budget_s <= 0:
        return None
    ends = [p.time_s for p in within[1:]] + [budget_s]
    return sum(p.accuracy * max(end - p.time_s, 0.0) for p, end in zip(within, ends)) / budget_s


def accuracy_on_grid(curve: Sequence[Point], times: Sequence[float]) -> list[float | None]:
    """The accuracy a run had at each time (its last checkpoint by then), for plotting."""
    return [accuracy_at_budget(curve, t) for t in times]
