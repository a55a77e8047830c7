"""Medians with distribution-free confidence intervals over seeds (docs/design.md §7).

The interval is the sign test's: with n values sorted, [x₍ₖ₎, x₍ₙ₊₁₋ₖ₎] contains the true median
unless k or more of the n values fall on one side of it, so it covers with probability
1 − 2·P(Binomial(n, ½) ≤ k − 1) whatever the values' distribution. k is the largest that keeps
that coverage at the confidence asked; the coverage it has is reported beside it. Below 6
values no k reaches 95 %: the interval is then [min, max] with the coverage it has (75 % at 3).

Not a percentile bootstrap: at 5–12 seeds the bootstrap's 95 % interval of the median covered
92.8–94.3 % of 2000 log-normal samples each (docs/measurements.md, 2026-12-06), and a
verdict read from it flipped between two runs of the demo.

A seed whose run never reached the target has time-to-target ∞: it counts in the median and
in the order (so a mode that often fails shows an open-ended interval), and is written as null
in JSON.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def coverage(n: int, k: int) -> float:
    """The probability that [x₍ₖ₎, x₍ₙ₊₁₋ₖ₎] of n values contains their true median."""
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0**n


def order_k(n: int, confidence: float) -> int:
    """The largest k ≤ n/2 whose interval keeps ``confidence`` (1: none does, the widest)."""
    k = 1
    while k + 1 <= n // 2 and coverage(n, k + 1) >= confidence:
        k += 1
    return k


def median_ci(values: Sequence[float | None], *, confidence: float = 0.95) -> dict[str, Any]:
    """``{"median", "ci": [lo, hi], "coverage", "per_seed"}``; None values (no result for a
    seed) count as +∞. Non-finite numbers come back as None, so the result is strict JSON."""
    numbers = [math.inf if v is None else float(v) for v in values]
    if not numbers:
        return {"median": None, "ci": [None, None], "coverage": None, "per_seed": []}
    ordered, n = sorted(numbers), len(numbers)
    k = order_k(n, confidence)
    return {
        "median": _json(statistics.median(numbers)),
        "ci": [_json(ordered[k - 1]), _json(ordered[n - k])],
        "coverage": coverage(n, k),
        "per_seed": [_json(v) for v in numbers],
    }


def _json(value: float) -> float | None:
    return value if math.isfinite(value) else None
