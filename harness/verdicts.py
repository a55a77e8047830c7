"""Verdicts the data supports: every pair of modes, compared seed by seed.

Each pair is a mode against a reference (the baseline first, then the modes in the order
they ran), paired within each seed — the seed's runs share tasks, initial model and, run one
after the other, the machine's state, so the seeds' spread cancels in the pair. Per metric the
per-seed values are summarised by ``harness.intervals.median_ci`` (the report's one
statistic: the median with the sign test's distribution-free CI) and the verdict is what that
CI supports:

- time to the target: the per-seed speed-up T_reference / T_mode (a mode that never reached
  it: 0; only the reference never did: ∞; neither did: 1, a tie). CI above 1: ``faster``;
  below 1: ``slower``.
- accuracy at the budget and the area under the accuracy-vs-time curve up to the budget
  (``harness.curves.area_under_curve``, a mean accuracy): the per-seed difference mode −
  reference. CI above 0: ``faster``; below 0: ``slower``.
- exact modes only (both ``Mode.exact``: the same update at every step, so equal accuracy at
  every step, which ``accuracy_equal_at_every_step`` checks): equal steps, the per-seed
  speed-up of cumulative step time at the last step both ran (and the median over seeds at
  every step). No learning noise enters it, only the machine's.

Otherwise, and always with fewer than ``MIN_SEEDS`` seeds (6: below that no interval of
the per-seed values has its 95 % coverage), ``not distinguishable``, with
``seeds_to_separate``: how many seeds would separate them at the observed variance
(``seeds_to_separate``'s formula).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.curves import accuracy_at_budget, area_under_curve, time_to_target
from harness.intervals import coverage, median_ci
from thundersync.training.modes import mode_from_label
from thundersync.training.run_metrics import read_metrics

CONFIDENCE = 0.95
FASTER, SLOWER, UNDECIDED = "faster", "slower", "not distinguishable"
MIN_SEEDS = next(n for n in range(2, 64) if coverage(n, 1) >= CONFIDENCE)
"""The fewest seeds a verdict needs (6 at 95 %). With n seeds the widest interval of the
median is [min, max] of the per-seed values (``harness.intervals``), which misses
the true median only when all n seeds fall on one side of it: probability 2·0.5^n, so it
covers it 75 % of the time at 3 seeds and 94 % at 5. Below ``CONFIDENCE`` an interval that
excludes no difference is every seed agreeing by chance too often (a quarter of the time
at 3 seeds, for two modes of one distribution)."""
MANY_SEEDS = 1000
"""Above this many seeds the estimate is said as "over 1000" (a mean difference that small
is no difference a comparison could show)."""


def pair_verdicts(runs: Sequence[Any], target: float, budget_s: float) -> dict[str, Any]:
    """``results.json``'s ``verdicts``: ``{"confidence", "pairs": {"<mode> vs <reference>":
    {...}}}`` for every pair of the runs' modes (each run has ``mode``, ``seed``, ``folder``
    and ``curve``)."""
    by_mode: dict[str, dict[int, Any]] = {}
    for run in runs:
        by_mode.setdefault(run.mode, {})[run.seed] = run
    roles = {name: mode_from_label(name, staleness=1) for name in by_mode}
    order = sorted(by_mode, key=lambda name: not roles[name].baseline)  # stable sort
    pairs = {}
    for i, reference in enumerate(order):
        for mode in order[i + 1 :]:
            exact = roles[mode].exact and roles[reference].exact
            pairs[f"{mode} vs {reference}"] = {
                "mode": mode,
                "against": reference,
                **_pair(by_mode[mode], by_mode[reference], target, budget_s, exact=exact),
            }
    return {"confidence": CONFIDENCE, "pairs": pairs}


def _pair(
    mode: dict[int, Any], reference: dict[int, Any], target: float, budget_s: float, *, exact: bool
) -> dict[str, Any]:
    seeds = sorted(set(mode) & set(reference))
    speedups = [
        _speedup(time_to_target(reference[s].curve, target), time_to_target(mode[s].curve, target))
        for s in seeds
    ]
    out: dict[str, Any] = {
        "seeds": seeds,
        "time_to_target": paired(speedups, ratio=True),
        "accuracy_at_budget": paired(
            _differences(mode, reference, seeds, lambda c: accuracy_at_budget(c, budget_s)),
            ratio=False,
        ),
        "area_under_curve": paired(
            _differences(mode, reference, seeds, lambda c: area_under_curve(c, budget_s)),
            ratio=False,
        ),
    }
    if exact:
        out["equal_steps"] = _equal_steps(mode, reference, seeds)
    return out


def _speedup(reference_s: float | None, mode_s: float | None) -> float | None:
    """T_reference / T_mode for one seed; None is ∞ (only the reference never got there)."""
    if reference_s is None:
        return 1.0 if mode_s is None else None
    if mode_s is None:
        return 0.0
    return reference_s / mode_s if mode_s > 0 else None


def _differences(
    mode: dict[int, Any], reference: dict[int, Any], seeds: list[int], measure: Any
) -> list[float]:
    """mode − reference per seed (a seed where either has no value is left out)."""
    pairs = [(measure(mode[s].curve), measure(reference[s].curve)) for s in seeds]
    return [a - b for a, b in pairs if a is not None and b is not None]


def paired(values: Sequence[float | None], *, ratio: bool) -> dict[str, Any]:
    """One metric's per-seed paired values (speed-ups when ``ratio``, None meaning ∞; else
    differences): ``median_ci``'s median, CI and per-seed values, the verdict its CI
    supports, and for an undecided one ``seeds_to_separate`` and the sentence saying it."""
    stat = median_ci(values, confidence=CONFIDENCE)
    lo, hi = (math.inf if v is None else v for v in stat["ci"])
    null = 1.0 if ratio else 0.0
    verdict = UNDECIDED
    if len(values) >= MIN_SEEDS and lo > null:
        verdict = FASTER
    elif len(values) >= MIN_SEEDS and hi < null:
        verdict = SLOWER
    out = {**stat, "statistic": "speedup" if ratio else "difference", "verdict": verdict}
    out["seeds_to_separate"] = out["seeds_to_separate_text"] = None
    if verdict == UNDECIDED:
        if ratio and any(v is None or v <= 0 for v in values):
            seeds, why = None, "a run never reached the target"
        else:
            logs = [math.log(v) if ratio else v for v in values if v is not None]
            seeds, why = seeds_to_separate(logs)
        if seeds is not None:
            seeds = max(seeds, len(values) + 1, MIN_SEEDS)  # these did not separate them
            about = f"about {seeds}" if seeds <= MANY_SEEDS else f"over {MANY_SEEDS}"
            text = f"{about} seeds would separate them at this variance"
        else:
            text = f"seeds to separate them not estimable: {why}"
        out["seeds_to_separate_text"] = text
        out["seeds_to_separate"] = seeds
    return out


def seeds_to_separate(differences: Sequence[float]) -> tuple[int | None, str]:
    """The seeds at which the CI would exclude no difference, at the observed variance:
    with mean d̄ and standard deviation s of the per-seed paired differences (log speed-ups
    for ratios), a normal-approximation CI of the mean has half-width z·s/√n
    (z = 1.96 at 95 %), which falls below |d̄| once n ≥ (z·s/|d̄|)²; that n, rounded up, at
    least 2. (None, why) when it cannot be estimated: fewer than 2 seeds, or d̄ = 0."""
    if len(differences) < 2:
        return None, "fewer than 2 seeds"
    mean = statistics.fmean(differences)
    if abs(mean) < 1e-12:
        return None, "the mean difference is 0"
    z = statistics.NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
    return max(2, math.ceil((z * statistics.stdev(differences) / abs(mean)) ** 2)), ""


def _equal_steps(mode: dict[int, Any], reference: dict[int, Any], seeds: list[int]) -> Any:
    """The speed-up at equal steps: per seed, the reference's cumulative step time over the
    mode's at the last step both ran; ``per_step``: the median over seeds at each step. None
    when a run has no ``metrics.jsonl``."""
    per_seed: list[float | None] = []
    per_step: list[list[float]] = []
    for seed in seeds:
        ours, theirs = _cumulative(mode[seed].folder), _cumulative(reference[seed].folder)
        steps = min(len(ours), len(theirs))
        if not steps:
            return None
        per_seed.append(theirs[steps - 1] / ours[steps - 1] if ours[steps - 1] > 0 else None)
        per_step.append([b / a if a > 0 else math.inf for a, b in zip(ours, theirs)])
    if not per_seed:
        return None
    shortest = min(len(r) for r in per_step)
    unequal = [
        {"seed": seed, "step": p.step}
        for seed in seeds
        for p in mode[seed].curve
        for q in reference[seed].curve
        if p.step == q.step and p.accuracy != q.accuracy
    ]
    return {
        **paired(per_seed, ratio=True),
        "steps": shortest,
        "per_step": [_finite(statistics.median(r[i] for r in per_step)) for i in range(shortest)],
        "accuracy_equal_at_every_step": not unequal,
        "accuracy_unequal_at": unequal,
    }


def _cumulative(folder: Path) -> list[float]:
    """The run's cumulative step time after each of its steps (``step_time_s`` summed)."""
    path = Path(folder) / "metrics.jsonl"
    if not path.exists():
        return []
    records = sorted(read_metrics(path), key=lambda m: m["step"])
    total, out = 0.0, []
    for record in records:
        total += record["step_time_s"]
        out.append(total)
    return out


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def verdict_lines(results: dict[str, Any]) -> list[str]:
    """The pairs' verdicts as plain lines of at most 80 columns: per pair a heading, then
    one line per metric (an undecided one followed by the seeds it had and the seeds that
    would separate them)."""
    verdicts = results.get("verdicts") or {}
    budget = f"{results['budget_s']:.0f} s"
    lines = []
    for name, pair in verdicts.get("pairs", {}).items():
        n = len(pair["seeds"])
        seeds = f"{n} seed{'s' * (n != 1)}"
        lines.append(f"compare: {name}, paired over {seeds} ({CONFIDENCE:.0%} CIs):")
        metrics = [
            (f"time to {results['target']:g}", pair["time_to_target"], ""),
            (f"acc at {budget}", pair["accuracy_at_budget"], ""),
            (f"area to {budget}", pair["area_under_curve"], " mean acc"),
        ]
        if pair.get("equal_steps"):
            steps = pair["equal_steps"]
            metrics.append((f"equal steps ({steps['steps']})", steps, ""))
        for what, stat, unit in metrics:
            lines.append(f"compare:   {what}: {stat['verdict']}, {_figure(stat)}{unit}")
            if stat["seeds_to_separate_text"]:
                lines.append(f"compare:     at {seeds}; {stat['seeds_to_separate_text']}")
            if stat.get("accuracy_equal_at_every_step") is False:
                first = stat["accuracy_unequal_at"][0]
                lines.append(
                    f"compare:     but accuracy differs at seed {first['seed']} step "
                    f"{first['step']}: not the same updates"
                )
    return lines


def _figure(stat: dict[str, Any]) -> str:
    """``1.21x [1.09, 1.25]`` (∞ for an open end) or ``+0.03 [-0.02, +0.08]``."""
    values = [stat["median"], *stat["ci"]]
    if stat["statistic"] == "speedup":
        a, lo, hi = ("∞" if v is None else f"{v:.2f}" for v in values)
        return f"{a}x [{lo}, {hi}]"
    a, lo, hi = ("n/a" if v is None else f"{v:+.2f}" for v in values)
    return f"{a} [{lo}, {hi}]"


METRICS = ("time_to_target", "accuracy_at_budget", "area_under_curve", "equal_steps")


def replication(first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, Any]]:
    """Each verdict two comparisons both give, side by side (a pair or metric only one of them
    has is left out): ``{"pair", "metric", "first", "second", "same", "first_figure",
    "second_figure"}``. Two runs of one command replicate when every row is ``same``; a verdict
    that differs while its CIs overlap was near the line in one run (docs/results.md)."""
    rows = []
    pairs = (second.get("verdicts") or {}).get("pairs", {})
    for name, pair in (first.get("verdicts") or {}).get("pairs", {}).items():
        for metric in METRICS:
            a, b = pair.get(metric), pairs.get(name, {}).get(metric)
            if a and b:
                rows.append(
                    {
                        "pair": name,
                        "metric": metric,
                        "first": a["verdict"],
                        "second": b["verdict"],
                        "same": a["verdict"] == b["verdict"],
                        "first_figure": _figure(a),
                        "second_figure": _figure(b),
                    }
                )
    return rows


def replication_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as plain lines, then how many verdicts agree."""
    lines = [
        f"{row['pair']}, {row['metric'].replace('_', ' ')}: {row['first']} "
        f"{row['first_figure']} / {row['second']} {row['second_figure']}"
        + ("" if row["same"] else "  <- differs")
        for row in rows
    ]
    same = sum(row["same"] for row in rows)
    return [*lines, f"{same} of {len(rows)} verdicts the same in both runs"]
