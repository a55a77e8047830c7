"""pass@k: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
on Code", arXiv:2107.03374), averaged over tasks.

For a task with n attempts of which c passed, pass@k = 1 − C(n−c, k) / C(n, k): the chance that
k attempts drawn without replacement from the n include a pass. Attempts that hit an
infrastructure failure are not attempts of the policy and are left out (n counts the others);
a task with fewer than k scored attempts has no pass@k.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with ``n`` attempts and ``c`` passes (needs k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def mean_pass_at_k(outcomes: Sequence[Sequence[bool]], k: int) -> float | None:
    """Mean pass@k over tasks (each a list of pass/fail of its scored attempts); tasks with
    fewer than k scored attempts are left out; None when none has k."""
    values = [pass_at_k(len(o), sum(o), k) for o in outcomes if len(o) >= k]
    return sum(values) / len(values) if values else None
