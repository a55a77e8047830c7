"""How much the rollout slows while the learner computes on the same machine (κ), measured
from a run's spans, and a run's ready times with that slowdown taken out (docs/design.md §4;
``harness/cross_prediction.py`` uses both, ``harness/virtual_run.py`` charges κ back)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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

COVERED = 0.5
"""The share of a batch's rollout its readings must cover to say its load. Readings during
the learner's work are left out, and where the learner works through most of the rollout
(streaming, the learner on its own core) the few left are a biased sample: on the matrix's
disaggregated long-tail they covered 0–20 % of each rollout, all at generation, and read 1.0
where the rollout's core idled most of the time."""

SATURATED = 0.95
"""A reading at least this busy: the cores were full, and batches rolling out during it
shared them."""


@dataclass(frozen=True, slots=True)
class Sharing:
    """What batches rolling out together share, read from a run: its rollout cores' load
    readings (``cpu_load``) taken while its learner idled, each with how many batches rolled
    out during it. What one batch alone asks of the cores, and where batches in flight
    together (async) slowed each other.

    Not the engine: it generates for every batch in flight in one batched call (an async
    run's calls held both batches' requests), so two batches do not take it twice as long;
    charged as a resource one batch holds at a time, it moved the demo's predictions from
    −1 % to +4 % and from async's run to −25 % (docs/measurements.md, 2026-12-06)."""

    readings: tuple[tuple[float, float, float, int], ...]
    """(started, finished, busy share, batches rolling out at its middle)."""
    alone: float
    """The mean share of the readings with one batch rolling out (1 with none: the cores
    were full wherever batches shared them, and a batch is taken to fill them alone)."""
    learner: float | None = None
    """The mean share of the readings taken while the learner computed and no batch rolled
    out (``LEARNER_ALONE`` of each inside its work); None: no such reading."""

    def share(self, busy: float, batches: int) -> float:
        """One batch's share, alone, from a reading of ``batches`` together: the reading
        itself for one; a part of it where the cores were not full (no batch slowed); the
        run's ``alone`` where they were, which the reading cannot split."""
        if batches <= 1:
            return busy
        return busy / batches if busy < SATURATED else self.alone

    def lost(self, start: float, t: float) -> float:
        """Seconds of [start, t] a batch lost to others beside it: in a full reading of m
        batches, each ran m times its share alone slower (at least 1), losing 1 − 1/that
        of each second."""
        out = 0.0
        for lo, hi, busy, batches in self.readings:
            factor = batches * self.share(busy, batches)
            if batches > 1 and factor > 1.0:
                out += max(0.0, min(t, hi) - max(start, lo)) * (1.0 - 1.0 / factor)
        return out

    def loads(
        self, batches: Sequence[StepWindow], clean: Callable[[StepWindow, float], float]
    ) -> tuple[Load, ...]:
        """Each of ``batches``' ``Load`` at ``clean``'s rollout seconds: its readings where
        they cover ``COVERED`` of its rollout, else none (0: not known, taken as sharing
        nothing); no readings at all (a run recorded before 2026-12-06), no loads."""
        if not self.readings:
            return ()
        out = []
        for w in batches:
            end = max(w.reward_times, default=w.submitted_at)
            mine = [r for r in self.readings if w.submitted_at <= r[0] and r[1] <= end]
            covered = sum(hi - lo for lo, hi, *_ in mine)
            cores = tuple(
                (clean(w, hi - w.submitted_at), self.share(busy, n)) for _, hi, busy, n in mine
            )
            if covered < COVERED * (end - w.submitted_at):
                cores = ((0.0, 0.0),)
            out.append(cores)
        return tuple(out)


LEARNER_ALONE = 0.9
"""The share of a reading that must lie in the learner's work, with no batch rolling out,
for it to say the learner's load: sync's learner computes 0.6 s a step on the matrix, two or
three readings, and one that straddles its start or end reads the idle gap too."""


def rollout_sharing(folder: Path, every: Sequence[StepWindow], busy: Sequence[Interval]) -> Sharing:
    """The run's ``Sharing``: its ``cpu`` readings outside the learner's work (the learner
    would be in the share), each with the batches rolling out at its middle; and the
    learner's own load, from the readings inside its work while nothing rolled out."""
    rolling = [(w.submitted_at, max(w.reward_times, default=w.submitted_at)) for w in every]
    readings, learner = [], []
    for s in read_jsonl(folder / "spans.jsonl"):
        if s.get("worker") == "machine" and s.get("name") == "cpu":
            lo, hi = float(s["started"]), float(s["finished"])
            middle, share = (lo + hi) / 2, float(s["metrics"]["busy"])
            n = sum(a <= middle <= b for a, b in rolling)
            if not overlap(lo, hi, busy):
                readings.append((lo, hi, share, n))
            elif not overlap(lo, hi, rolling) and overlap(lo, hi, busy) >= LEARNER_ALONE * (
                hi - lo
            ):
                learner.append(share)
    alone = [r[2] for r in readings if r[3] == 1]
    return Sharing(
        tuple(readings),
        sum(alone) / len(alone) if alone else 1.0,
        sum(learner) / len(learner) if learner else None,
    )


def load_at(load: Load, progress: float) -> tuple[float, float]:
    """(the share at rollout second ``progress``, rollout seconds until it next changes:
    ∞ past the last reading)."""
    for end, share in load:
        if progress < end - 1e-12:
            return share, end - progress
    return (load[-1][1] if load else 0.0), float("inf")
