"""How much the rollout slows while the learner computes on the same machine (κ), measured
from a run's spans, and a run's ready times with that slowdown taken out (docs/design.md §4;
``harness/cross_prediction.py`` uses both, ``harness/virtual_run.py`` charges κ back)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.critical_path import StepWindow, nonnegative_least_squares, read_jsonl

Interval = tuple[float, float]

LEARNER_WORK = frozenset({"backward", "step", "weight_publish"})
"""The learner spans during which it computes (the optimizer is inside ``step``)."""


@dataclass(frozen=True, slots=True)
class Contention:
    """How much slower rollout ran while the learner computed (κ), and what showed it."""

    kappa: float
    generation_slowdown: float | None
    """Seconds per decode step of generation during learner work over those without it."""
    engine_share: float
    """The engine's busy share of the rollout's time."""
    measured: bool
    """False: the run's learner never overlapped its rollout (κ given or 0)."""


def merged(intervals: Sequence[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def overlap(lo: float, hi: float, busy: Sequence[Interval]) -> float:
    """Seconds of [lo, hi] inside the merged intervals ``busy``."""
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in busy)


def learner_busy(folder: Path) -> list[Interval]:
    spans = read_jsonl(folder / "spans.jsonl")
    return merged(
        [
            (float(s["started"]), float(s["finished"]))
            for s in spans
            if s.get("worker") == "learner" and s.get("name") in LEARNER_WORK
        ]
    )


def fit_contention(
    folder: Path, windows: Sequence[StepWindow], busy: Sequence[Interval], given: float | None
) -> Contention:
    """κ from the engine's spans (module docstring); ``given`` overrides it."""
    engine = [
        s
        for s in read_jsonl(folder / "spans.jsonl")
        if s.get("worker") == "engine" and s.get("name") == "engine"
    ]
    rollout = merged(
        [(w.submitted_at, max(w.reward_times, default=w.submitted_at)) for w in windows]
    )
    total = sum(hi - lo for lo, hi in rollout)
    generating = merged([(float(s["started"]), float(s["finished"])) for s in engine])
    share = sum(overlap(lo, hi, rollout) for lo, hi in generating) / total if total else 0.0
    slowdown = generation_slowdown(engine, busy)
    if given is not None:
        return Contention(given, slowdown, share, measured=False)
    if slowdown is None:
        return Contention(0.0, None, share, measured=False)
    return Contention(max(slowdown - 1.0, 0.0) * share, slowdown, share, measured=True)


def generation_slowdown(engine: Sequence[dict[str, Any]], busy: Sequence[Interval]) -> float | None:
    """How much slower the engine generated beside the learner: a generation batch of ``bs``
    requests and n = tokens / bs decode steps costs n · (a + b · bs) alone (a and b fitted to
    the batches that ran while the learner idled), and (1 + s · ρ) times that where the
    learner computed for a share ρ of it; 1 + s, or None with fewer than three of each."""
    alone: list[tuple[float, float, float]] = []  # (n, n·bs, seconds)
    shared: list[tuple[float, float, float, float]] = []  # (n, n·bs, seconds, ρ)
    for span in engine:
        lo, hi = float(span["started"]), float(span["finished"])
        metrics = span.get("metrics") or {}
        size = max(1, int(metrics.get("batch_size", 1)))
        n = max(1.0, float(metrics.get("num_tokens", 0)) / size)
        if hi > lo:
            rho = overlap(lo, hi, busy) / (hi - lo)
            if rho == 0.0:
                alone.append((n, n * size, hi - lo))
            else:
                shared.append((n, n * size, hi - lo, rho))
    if len(alone) < 3 or len(shared) < 3:
        return None
    a, b = nonnegative_least_squares([r[:2] for r in alone], [r[2] for r in alone])
    base = [(a * n + b * nb, seconds, rho) for n, nb, seconds, rho in shared]
    weight = sum(rho * cost for cost, _, rho in base)
    return 1.0 + max(sum(seconds - cost for cost, seconds, _ in base) / weight, 0.0)


def uncontended(t: float, start: float, busy: Sequence[Interval], kappa: float) -> float:
    """Rollout seconds from ``start`` to ``t`` had the learner not competed with it."""
    return (t - start) - kappa / (1.0 + kappa) * overlap(start, t, busy)


Load = tuple[tuple[float, float], ...]
"""A batch's rollout load: (rollout seconds from its start at which a reading ends, the busy
share of the rollout's cores over it), in order; the last share holds after its end."""


def rollout_loads(
    folder: Path,
    batches: Sequence[StepWindow],
    every: Sequence[StepWindow],
    busy: Sequence[Interval],
    kappa: float,
) -> tuple[Load, ...]:
    """Each of ``batches``' rollout load (``cpu_load``'s readings, ``Load``), from the
    readings taken while it alone rolled out and the learner idled: another batch's rollout
    or the learner would be in the share. Its times are uncontended rollout seconds
    (``uncontended``). A batch with no such reading gets the run's mean share, held from its
    start; a run with no readings (recorded before 2026-12-06), no loads at all: the
    simulator then lets batches in flight together run as fast as one alone."""
    readings = [
        (float(s["started"]), float(s["finished"]), float(s["metrics"]["busy"]))
        for s in read_jsonl(folder / "spans.jsonl")
        if s.get("worker") == "machine" and s.get("name") == "cpu"
    ]
    if not readings:
        return ()
    rolling = [(w.submitted_at, max(w.reward_times, default=w.submitted_at)) for w in every]
    measured: list[list[tuple[float, float]]] = []
    for w in batches:
        start, end = w.submitted_at, max(w.reward_times, default=w.submitted_at)
        others = [iv for iv in rolling if iv != (start, end)]
        load = [
            (uncontended(hi, start, busy, kappa), share)
            for lo, hi, share in readings
            if start <= lo
            and hi <= end
            and not overlap(lo, hi, busy)
            and not overlap(lo, hi, merged(others))
        ]
        measured.append(load)
    shares = [share for load in measured for _, share in load]
    if not shares:
        return ()
    mean = sum(shares) / len(shares)
    return tuple(tuple(load) if load else ((0.0, mean),) for load in measured)


def load_at(load: Load, progress: float) -> tuple[float, float]:
    """(the share at rollout second ``progress``, rollout seconds until it next changes:
    ∞ past the last reading)."""
    for end, share in load:
        if progress < end - 1e-12:
            return share, end - progress
    return (load[-1][1] if load else 0.0), float("inf")
