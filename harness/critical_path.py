"""Step times of a training run, read from its run folder, and the bound T* that no
zero-staleness schedule can beat (docs/design.md §4).

For one batch with reward-ready times cᵢ (from the batch's start) and learner work bᵢ per
trajectory, the best any zero-staleness schedule can do on one learner is

    T* = max_k ( c₍ₖ₎ + Σ_{j≥k} b₍ⱼ₎ ) + optimizer + weight sync

over trajectories sorted by cᵢ. bᵢ = L_sync / N, the *batched* learner cost per trajectory
measured in a sync run (a lone trajectory's backward costs more, so this bound assumes
streaming loses nothing to batching). Streaming's efficiency is T* / T.

With early start a trajectory's backward may begin when its episode completes (eᵢ), before
its reward: the bound is then max( max_k (e₍ₖ₎ + Σ_{j≥k} b₍ⱼ₎), max cᵢ ) + optimizer + sync.

For OPD the work items are turns, each ready at its teacher score; the step cannot close
before the batch's last episode has ended either (until an episode ends, another turn may
come: a last tool call runs after the last scored action), so the tail is at least max eᵢ.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thundersync.protocol.episode import step_of
from thundersync.training.run_metrics import read_metrics


@dataclass(frozen=True, slots=True)
class StepWindow:
    """One step of a run: when its batch was handed to rollout and when the step ended,
    its episodes' reward-ready times, and the learner spans inside it."""

    step: int
    submitted_at: float
    finished_at: float
    reward_times: tuple[float, ...]
    durations: dict[str, float]
    """Summed span durations by name (step, optimizer, weight_publish, ...) in the window."""
    completed_times: tuple[float, ...] = ()
    """When each episode's last action was fixed (``EpisodeCompleted``)."""
    teacher_times: tuple[float, ...] = ()
    """OPD: when the teacher scored each turn (``TeacherScored``), the moment that turn's
    gradient can start."""
    passes: tuple[tuple[int, float], ...] = ()
    """The learner's backward passes in the window: (work items in the pass, its seconds).
    Items of one pass share its start (a drained micro-batch)."""
    step_interval_s: float | None = None
    """Seconds since the previous step ended (``metrics.jsonl``'s ``step_time_s``): the
    run's throughput, which differs from ``time_s`` when batches overlap (async)."""

    @property
    def time_s(self) -> float:
        return self.finished_at - self.submitted_at

    @property
    def work_times(self) -> tuple[float, ...]:
        """When each piece of gradient work had its inputs (rewards for GRPO, teacher scores
        per turn for OPD)."""
        return self.teacher_times or self.reward_times

    @property
    def learner_time_s(self) -> float:
        """The learner's batched work in this step: ``learner.step()`` minus its optimizer."""
        return max(self.durations.get("step", 0.0) - self.durations.get("optimizer", 0.0), 0.0)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


_TIMES = {"RewardReady": 0, "EpisodeCompleted": 1, "TeacherScored": 2}


def step_windows(run: Path) -> list[StepWindow]:
    """The steps of the run folder ``run`` (from metrics.jsonl, events.jsonl, spans.jsonl)."""
    metrics = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    events = read_jsonl(run / "events.jsonl")
    spans = read_jsonl(run / "spans.jsonl")
    times: dict[int, tuple[list[float], list[float], list[float]]] = {}
    for e in events:
        kind = _TIMES.get(e.get("event", ""))
        batch = step_of(str(e.get("episode_id", "")))
        if kind is not None and batch is not None:
            times.setdefault(batch, ([], [], []))[kind].append(float(e["t"]))
    windows, previous_end = [], float("-inf")
    for m in metrics:
        lo, hi = float(m["submitted_at"]), float(m["finished_at"])
        # the learner's spans of this step: after the previous step ended (async rolls batches
        # out while the learner still works on older ones, so their windows overlap)
        learner_lo, previous_end = max(lo, previous_end), hi
        durations: dict[str, float] = {}
        passes: dict[float, tuple[int, float]] = {}
        for s in spans:
            if s.get("worker") == "learner" and learner_lo <= s["started"] and s["finished"] <= hi:
                durations[s["name"]] = durations.get(s["name"], 0.0) + s["finished"] - s["started"]
                if s["name"] == "backward":
                    count, end = passes.get(s["started"], (0, s["started"]))
                    passes[s["started"]] = (count + 1, max(end, s["finished"]))
        batch = m["step"] - 1  # step N trains on batch N-1 (episode ids s<N-1>-…)
        rewards, completed, teacher = times.get(batch, ([], [], []))
        windows.append(
            StepWindow(
                m["step"],
                lo,
                hi,
                tuple(rewards),
                durations,
                tuple(completed),
                tuple(teacher),
                tuple((k, end - start) for start, (k, end) in sorted(passes.items())),
                m.get("step_time_s"),
            )
        )
    return windows


def batched_cost_per_trajectory(sync_run: Path) -> float:
    """bᵢ = L_sync / N: the sync run's learner time per step (its ``learner.step()`` minus
    the optimizer), divided by the work items per batch (trajectories for GRPO, turns for
    OPD); the median over steps."""
    costs = [w.learner_time_s / len(w.work_times) for w in step_windows(sync_run) if w.work_times]
    if not costs:
        raise ValueError(f"{sync_run}: no complete steps to measure the learner's cost on")
    return statistics.median(costs)


def pass_cost(windows: list[StepWindow]) -> tuple[float, float]:
    """(o, b): the fixed cost of a backward pass and the cost per work item in it, fitted by
    least squares to the passes of ``windows`` (seconds = o + k·b for a pass of k items). With
    passes of one size only, o is 0 and b their mean seconds per item."""
    passes = [p for w in windows for p in w.passes]
    if not passes:
        raise ValueError("no backward passes recorded (a sync run computes inside its step)")
    n = len(passes)
    mean_k = sum(k for k, _ in passes) / n
    mean_t = sum(t for _, t in passes) / n
    spread = sum((k - mean_k) ** 2 for k, _ in passes)
    if spread == 0:
        return 0.0, mean_t / mean_k
    b = sum((k - mean_k) * (t - mean_t) for k, t in passes) / spread
    o = mean_t - b * mean_k
    if b <= 0 or o < 0:  # noise: a fit that says items are free or passes pay back
        return 0.0, sum(t for _, t in passes) / sum(k for k, _ in passes)
    return o, b


def bound(window: StepWindow, cost_per_trajectory: float, *, early_start: bool = False) -> float:
    """T* of one step (seconds from its batch's start), each work item charged
    ``cost_per_trajectory`` (OPD: each turn, from its teacher score)."""
    times = window.work_times
    if early_start and not window.teacher_times:
        times = window.completed_times
    ready = sorted(t - window.submitted_at for t in times)
    n = len(ready)
    tail = max((c + (n - k) * cost_per_trajectory for k, c in enumerate(ready)), default=0.0)
    if early_start and not window.teacher_times:
        tail = max([tail, *(t - window.submitted_at for t in window.reward_times)])
    if window.teacher_times:  # OPD: no turn is known to be the last before its episode ends
        tail = max([tail, *(t - window.submitted_at for t in window.completed_times)])
    overhead = window.durations.get("optimizer", 0.0) + window.durations.get("weight_publish", 0.0)
    return tail + overhead


def summarize(
    run: Path, cost_per_trajectory: float | None = None, *, skip_first: bool = True
) -> dict[str, Any]:
    """Median step time and, given bᵢ, median T* and T*/T of a run (its first step, a
    warm-up, left out when ``skip_first`` and there are others)."""
    windows = step_windows(run)
    if skip_first and len(windows) > 1:
        windows = windows[1:]
    if not windows:
        raise ValueError(f"{run}: no steps to summarise")
    out: dict[str, Any] = {
        "steps": len(windows),
        "step_time_s": statistics.median(w.time_s for w in windows),
        "step_times_s": [w.time_s for w in windows],
    }
    if cost_per_trajectory is not None:
        config = run / "config.json"
        early = config.is_file() and bool(json.loads(config.read_text()).get("early_start"))
        bounds = [bound(w, cost_per_trajectory, early_start=early) for w in windows]
        out["bound_s"] = statistics.median(bounds)
        out["efficiency"] = statistics.median(b / w.time_s for b, w in zip(bounds, windows))
    return out
