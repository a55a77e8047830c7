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
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    completed_times: tuple[float, ...] = ()
    """When each episode's last action was fixed (``EpisodeCompleted``)."""
    """Summed span durations by name (step, optimizer, weight_publish, ...) in the window."""

    @property
    def time_s(self) -> float:
        return self.finished_at - self.submitted_at


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_windows(run: Path) -> list[StepWindow]:
    """The steps of the run folder ``run`` (from metrics.jsonl, events.jsonl, spans.jsonl)."""
    metrics = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    events = read_jsonl(run / "events.jsonl")
    spans = read_jsonl(run / "spans.jsonl")
    rewards: dict[int, list[float]] = {}
    completed: dict[int, list[float]] = {}
    for e in events:
        kind, eid = e.get("event"), str(e.get("episode_id", ""))
        if kind in ("RewardReady", "EpisodeCompleted") and eid.startswith("s"):
            table = rewards if kind == "RewardReady" else completed
            table.setdefault(int(eid.split("-", 1)[0][1:]), []).append(float(e["t"]))
    windows = []
    for m in metrics:
        lo, hi = float(m["submitted_at"]), float(m["finished_at"])
        durations: dict[str, float] = {}
        for s in spans:
            if s.get("worker") == "learner" and lo <= s["started"] and s["finished"] <= hi:
                durations[s["name"]] = durations.get(s["name"], 0.0) + s["finished"] - s["started"]
        batch = m["step"] - 1  # step N trains on batch N-1 (episode ids s<N-1>-…)
        windows.append(
            StepWindow(
                m["step"],
                lo,
                hi,
                tuple(rewards.get(batch, ())),
                durations,
                tuple(completed.get(batch, ())),
            )
        )
    return windows


def batched_cost_per_trajectory(sync_run: Path) -> float:
    """bᵢ = L_sync / N: the sync run's learner time per step (its ``learner.step()`` minus
    the optimizer), divided by the trajectories per batch; the median over steps."""
    costs = []
    for w in step_windows(sync_run):
        learn = w.durations.get("step", 0.0) - w.durations.get("optimizer", 0.0)
        if w.reward_times:
            costs.append(max(learn, 0.0) / len(w.reward_times))
    if not costs:
        raise ValueError(f"{sync_run}: no complete steps to measure the learner's cost on")
    return statistics.median(costs)


def bound(window: StepWindow, cost_per_trajectory: float, *, early_start: bool = False) -> float:
    """T* of one step (seconds from its batch's start)."""
    times = window.completed_times if early_start else window.reward_times
    ready = sorted(t - window.submitted_at for t in times)
    n = len(ready)
    tail = max((c + (n - k) * cost_per_trajectory for k, c in enumerate(ready)), default=0.0)
    if early_start:
        tail = max([tail, *(t - window.submitted_at for t in window.reward_times)])
    overhead = window.durations.get("optimizer", 0.0) + window.durations.get("weight_publish", 0.0)
    return tail + overhead


def summarize(
    run: Path, cost_per_trajectory: float | None = None, *, skip_first: bool = True
) -> dict[str, Any]:
    """Median step time and, given bᵢ, median T* and T*/T of a run."""
    windows = step_windows(run)[1 if skip_first else 0 :]
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
