"""``thundersync simulate``: the three modes' step times for a workload, without running a model.

A discrete-event model of one learner fed by one rollout batch per step (docs/design.md §4):
trajectory i's reward is ready cᵢ after its batch starts; a learner micro-batch of k
trajectories costs ``o + k·b`` (``b`` the batched cost per trajectory, ``o`` the fixed cost of
a pass, so a lone backward costs ``o + b``); then the optimizer and the weight sync.

- sync: T = max cᵢ + passes of the whole batch + optimizer + sync (replaying a run, the
  learner starts no earlier than the batch is complete: every reward in, which for OPD, whose
  cᵢ are teacher scores per turn, comes after the last score).
- streaming (lazy drain): whenever the learner is free it takes everything that has arrived
  as one micro-batch; eager: one pass per trajectory.
- async(k): batch n starts when the weights of step n−k−1 exist; the learner takes batch n
  when it is complete; the step time is the learner's throughput.
- T*: max_k (c₍ₖ₎ + Σ_{j≥k} b) + optimizer + sync, the bound of any zero-staleness schedule.

A workload is named (``long-tail``, ``balanced``, ``agentic``) or read from a run folder (its
reward-ready times per step, and b, o, optimizer and sync from its spans), so a prediction can
be checked against a measured run (``replay_run``, which ``benchmarks/matrix.py`` prints for
every cell); ``--project FILE`` projects a cluster from stated inputs
(``harness/projection.py``).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Workload:
    """One learner's view of training: per step, when each trajectory's reward is ready."""

    name: str
    ready_s: tuple[tuple[float, ...], ...]
    """Per step, the reward-ready times of its trajectories (from the batch's start)."""
    cost_per_trajectory_s: float
    """b: batched learner time per trajectory."""
    pass_overhead_s: float = 0.0
    """o: fixed cost of one learner pass (a lone trajectory costs o + b)."""
    optimizer_s: float = 0.0
    sync_s: float = 0.0
    micro_batch_size: int = 8
    notes: dict[str, Any] = field(default_factory=dict)


def named_workload(name: str, *, steps: int = 20, seed: int = 0) -> Workload:
    """``long-tail`` (32 log-normal completions, median 2 s, σ 1; batched learner time about
    half the makespan), ``balanced`` (σ 0.5; learner time about the makespan), ``agentic``
    (64 episodes of minutes, σ 1.2; learner about half the makespan). The fixed cost of a
    learner pass is a fifth of a trajectory's (a lone backward costs 1.2× its batched share,
    as measured on CPU; docs/design.md §4)."""
    presets = {
        "long-tail": (32, 2.0, 1.0, 0.25, 0.05),
        "balanced": (32, 2.0, 0.5, 0.18, 0.04),
        "agentic": (64, 120.0, 1.2, 11.0, 2.0),
    }
    if name not in presets:
        raise ValueError(
            f"unknown workload {name!r}; expected one of {sorted(presets)} or a run folder"
        )
    n, median, sigma, b, o = presets[name]
    rng = random.Random(seed)
    ready = tuple(
        tuple(median * math.exp(sigma * rng.gauss(0, 1)) for _ in range(n)) for _ in range(steps)
    )
    return Workload(name, ready, b, o, optimizer_s=b * 2, sync_s=b)


def run_workload(folder: Path, sync_folder: Path | None = None) -> Workload:
    """A measured run's workload: its reward-ready times per step; b and o from a sync run's
    learner spans (``sync_folder``, or the run itself when it is a sync run)."""
    from harness.critical_path import batched_cost_per_trajectory, step_windows

    windows = step_windows(folder)
    b = batched_cost_per_trajectory(sync_folder or folder)
    ready = tuple(tuple(t - w.submitted_at for t in w.reward_times) for w in windows)
    opt = statistics.median(w.durations.get("optimizer", 0.0) for w in windows)
    sync = statistics.median(w.durations.get("weight_publish", 0.0) for w in windows)
    measured = [w.time_s for w in windows]
    return Workload(
        folder.name,
        ready,
        b,
        0.0,
        optimizer_s=opt,
        sync_s=sync,
        notes={"measured_step_time_s": statistics.median(measured)},
    )


def replay_run(folder: Path) -> dict[str, Any]:
    """A run replayed in its own mode from its own measurements: each step's ready times
    (rewards; completions with early start; teacher scores per turn for OPD) and the learner's
    costs from its spans (a sync or async run: ``learner.step()`` minus the optimizer per work
    item; a streaming run: o and b fitted to its backward passes, and its closing ``step``),
    beside the step time it measured: the simulator checked against a real run. Sync and
    streaming: the median over steps (the first, a warm-up, left out) of a step's time from its
    batch's submission to its end; async: the mean interval between step ends once the
    pipeline is full (after step k+1), its throughput."""
    from harness.critical_path import pass_cost, step_windows

    config = json.loads((folder / "config.json").read_text())
    mode, staleness = config["mode"], int(config.get("staleness", 1))
    every = step_windows(folder)
    # async: the steady state comes after the pipeline's fill (steps 1..k+1)
    skip = staleness + 1 if mode == "async" else 1
    if len(every) < skip + 2 or not all(w.work_times for w in every):
        raise ValueError(f"{folder}: needs at least {skip + 2} complete steps to replay")
    windows = every if mode == "async" else every[1:]
    early = mode == "streaming" and bool(config.get("early_start")) and not every[0].teacher_times

    def relative(w: Any, times: Sequence[float]) -> tuple[float, ...]:
        return tuple(t - w.submitted_at for t in times)

    ready = tuple(relative(w, w.completed_times if early else w.work_times) for w in windows)
    publish = statistics.median(w.durations.get("weight_publish", 0.0) for w in windows)
    if mode == "streaming":
        o, b = pass_cost(windows)
        closing = statistics.median(w.durations.get("step", 0.0) for w in windows)
    else:
        o, b = 0.0, statistics.median(w.learner_time_s / len(w.work_times) for w in windows)
        closing = statistics.median(w.durations.get("optimizer", 0.0) for w in windows)
    work = Workload(
        folder.name,
        ready,
        b,
        o,
        optimizer_s=closing,
        sync_s=publish,
        micro_batch_size=int(config.get("micro_batch_size", 8)),
    )
    if mode == "async":
        done = async_schedule(work, staleness)
        predicted = (done[-1] - done[skip - 1]) / (len(done) - skip)
        measured = (every[-1].finished_at - every[skip - 1].finished_at) / (len(every) - skip)
    else:
        # a step closes once its batch is complete, every reward in: after the work's inputs
        # with early start (completions) and OPD (teacher scores per turn)
        gates = [max(relative(w, w.reward_times), default=0.0) for w in windows]
        if mode == "sync":
            steps = [sync_step(r, work, gate=g) for r, g in zip(ready, gates)]
        else:
            steps = [streaming_step(r, work, gate=g) for r, g in zip(ready, gates)]
        predicted = statistics.median(steps)
        measured = statistics.median(w.time_s for w in windows)
    return {
        "run": folder.name,
        "mode": mode if mode != "async" else f"async-k{staleness}",
        "early_start": early,
        "predicted_step_time_s": predicted,
        "measured_step_time_s": measured,
        "error": predicted / measured - 1.0,
        "cost_per_item_s": b,
        "pass_overhead_s": o,
    }


def _passes(k: int, w: Workload) -> float:
    batches = math.ceil(k / w.micro_batch_size) if k else 0
    return batches * w.pass_overhead_s + k * w.cost_per_trajectory_s


def sync_step(ready: Sequence[float], w: Workload, *, gate: float = 0.0) -> float:
    """Sync's step: the whole batch learned once it is complete (``gate``: its last reward,
    where the work's inputs come earlier, as OPD's teacher scores do)."""
    return max(max(ready), gate) + _passes(len(ready), w) + w.optimizer_s + w.sync_s


def streaming_step(
    ready: Sequence[float], w: Workload, *, eager: bool = False, gate: float = 0.0
) -> float:
    """Streaming's step: the learner drains what has arrived (``eager``: one item per pass);
    the step closes no earlier than ``gate`` (with early start, the last reward)."""
    arrivals, t, i = sorted(ready), 0.0, 0
    while i < len(arrivals):
        t = max(t, arrivals[i])
        k = 1 if eager else sum(1 for a in arrivals[i:] if a <= t)
        t += _passes(k, w)
        i += k
    return max(t, gate) + w.optimizer_s + w.sync_s


def bound_step(ready: Sequence[float], w: Workload) -> float:
    arrivals, b = sorted(ready), w.cost_per_trajectory_s
    n = len(arrivals)
    tail = max(c + (n - k) * b for k, c in enumerate(arrivals))
    return tail + w.optimizer_s + w.sync_s


def async_schedule(w: Workload, staleness: int) -> list[float]:
    """When each step of async(k) ends: batches 0..k start at once, batch n once step
    n−k−1's weights exist (``modes/async_.py``); the learner takes a batch when it is
    complete."""
    done: list[float] = []  # learner finish time of each step
    learner_free = 0.0
    for n, ready in enumerate(w.ready_s):
        start = done[n - staleness - 1] if n - staleness - 1 >= 0 else 0.0
        available = start + max(ready)
        learner_free = max(learner_free, available) + _passes(len(ready), w) + w.optimizer_s
        done.append(learner_free + w.sync_s)
    return done


def async_steps(w: Workload, staleness: int) -> float:
    """Mean step time of async(k), the pipeline's filling included."""
    done = async_schedule(w, staleness)
    return done[-1] / len(done)


def simulate(w: Workload, *, staleness: int = 1) -> dict[str, Any]:
    sync = [sync_step(r, w) for r in w.ready_s]
    lazy = [streaming_step(r, w) for r in w.ready_s]
    eager = [streaming_step(r, w, eager=True) for r in w.ready_s]
    bound = [bound_step(r, w) for r in w.ready_s]
    mean = statistics.mean
    result = {
        "workload": w.name,
        "steps": len(w.ready_s),
        "step_time_s": {
            "sync": mean(sync),
            "streaming": mean(lazy),
            "streaming-eager": mean(eager),
            f"async-k{staleness}": async_steps(w, staleness),
            "bound": mean(bound),
        },
        "efficiency": {
            "streaming": mean(b / t for b, t in zip(bound, lazy)),
            "streaming-eager": mean(b / t for b, t in zip(bound, eager)),
        },
        **w.notes,
    }
    times = result["step_time_s"]
    result["speedup_vs_sync"] = {k: times["sync"] / v for k, v in times.items() if k != "bound"}
    return result
