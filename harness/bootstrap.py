"""Medians with bootstrap confidence intervals over seeds (percentile bootstrap).

With a handful of seeds an interval is wide; that is the honest answer, and it is reported.
A seed whose run never reached the target has time-to-target ∞: it counts in the median and
in the resamples (so a mode that often fails shows an open-ended interval), and is written as
null in JSON.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

RESAMPLES = 2000


def median_ci(
    values: Sequence[float | None], *, confidence: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """``{"median", "ci": [lo, hi], "per_seed"}``; None values (no result for a seed) count
    as +∞. Non-finite numbers come back as None, so the result is strict JSON."""
    numbers = [math.inf if v is None else float(v) for v in values]
    if not numbers:
        return {"median": None, "ci": [None, None], "per_seed": []}
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(numbers, k=len(numbers))) for _ in range(RESAMPLES)
    )
    tail = (1.0 - confidence) / 2
    lo = medians[int(tail * (RESAMPLES - 1))]
    hi = medians[int((1.0 - tail) * (RESAMPLES - 1))]
    return {
        "median": _json(statistics.median(numbers)),
        "ci": [_json(lo), _json(hi)],
        "per_seed": [_json(v) for v in numbers],
    }


def _json(value: float) -> float | None:
    return value if math.isfinite(value) else None
