"""``thundersync simulate``: every registered mode's step time on a workload, without a model.

Each mode object of ``thundersync/training/modes/`` runs its own loop over a ``VirtualRun``
(``harness/virtual_run.py``): one learner fed by rollout batches on a virtual clock, trajectory
i's work ready cᵢ after its batch starts, a learner pass over micro-batches (``micro_batch_size``
rows, shortest first, each padded to its longest row) costing per micro-batch ``o`` + rows·``b``
+ padded tokens·(forwards·``f`` + backwards·``g``), then the optimizer and the weight sync
(``harness/workload.py``). What differs between the modes is only what each mode object does:
how many batches it keeps in flight and when it hands events to the learner, and whether its
learner contract streams. T* = max_k (c₍ₖ₎ + Σ_{j≥k} b) + optimizer + sync is the bound of any
zero-staleness schedule.

A workload is named (``long-tail``, ``balanced``, ``agentic``) or read from a run folder;
``replay_run`` (``harness/replay.py``) replays a run in its own mode, ``predict_from_run``
(``harness/cross_prediction.py``) predicts every mode from one run of any mode, and
``--project FILE`` projects a cluster from stated inputs (``harness/projection.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from harness.virtual_run import drive
from harness.workload import Workload
from thundersync.training.modes import REGISTRY, Mode


def registered_modes(staleness: int) -> list[Mode]:
    """Every registered mode, async with ``staleness``."""
    modes = [cls.from_label(cls.name, staleness=staleness) for cls in REGISTRY]
    return [m for m in modes if m is not None]


def step_times(mode: Mode, w: Workload, *, eager: bool = False) -> list[float]:
    """Each step's time of ``mode`` on ``w``: from its batch's submission to its step's end."""
    return [h["finished_at"] - h["submitted_at"] for h in drive(mode, w, eager=eager)]


def mean_step_time(mode: Mode, w: Workload, *, eager: bool = False) -> float:
    """The time of the whole run over its steps (with more than one batch in flight, the
    pipeline's filling included)."""
    history = drive(mode, w, eager=eager)
    return history[-1]["finished_at"] / len(history)


def bound_step(ready: Sequence[float], w: Workload) -> float:
    arrivals, b = sorted(ready), w.cost_per_trajectory_s
    n = len(arrivals)
    tail = max(c + (n - k) * b for k, c in enumerate(arrivals))
    return tail + w.optimizer_s + w.sync_s


def simulate(w: Workload, *, staleness: int = 1) -> dict[str, Any]:
    """Every registered mode's mean step time on ``w`` (async with ``staleness``), keyed by
    its label; a streaming mode's eager drain too (``<label>-eager``), and the bound T*."""
    mean = statistics.mean
    bound = [bound_step(r, w) for r in w.ready_s]
    times: dict[str, float] = {}
    efficiency: dict[str, float] = {}
    baseline = ""
    for mode in registered_modes(staleness):
        baseline = mode.label if mode.baseline else baseline
        times[mode.label] = mean_step_time(mode, w)
        if mode.learner_contract().streams:
            for label, eager in ((mode.label, False), (f"{mode.label}-eager", True)):
                steps = step_times(mode, w, eager=eager)
                times[label] = mean(steps)
                efficiency[label] = mean(b / t for b, t in zip(bound, steps))
    times["bound"] = mean(bound)
    result: dict[str, Any] = {
        "workload": w.name,
        "steps": len(w.ready_s),
        "step_time_s": times,
        "efficiency": efficiency,
        **w.notes,
    }
    result["speedup_vs_sync"] = {k: times[baseline] / v for k, v in times.items() if k != "bound"}
    return result
