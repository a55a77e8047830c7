"""The comparison's report: per-mode statistics over seeds, ``results.json``, plots, the table
and a one-line verdict."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from harness.critical_path import BatchedCost, batched_cost
from harness.critical_path import summarize as critical_path
from harness.curves import accuracy_at_budget, time_to_target
from harness.intervals import median_ci
from harness.plots import write_plots
from harness.verdicts import pair_verdicts
from thundersync.training.modes import mode_from_label

BREAKDOWN = (
    "engine",
    "teacher",
    "backward",
    "step",
    "optimizer",
    "weight_publish",
    "weight_sync",
)
"""The parts of a step that one worker does one at a time: each one's busy seconds over the
training time is a fraction (``breakdown_fraction``). Tools and grading are not among them:
they run in many episodes at once, so their seconds summed over episodes exceed the step (they
are reported per episode instead: ``tool_s_per_episode``, ``grading_s_per_episode``)."""


def summarize(runs: list[Any], config: Any, initial_accuracy: float) -> dict[str, Any]:
    """Statistics per mode (keys sync, streaming, async-k<K>), each over seeds."""
    budget = config.budget_s or min(max(p.time_s for p in run.curve) for run in runs)
    modes: dict[str, list[Any]] = {}
    for run in runs:
        modes.setdefault(run.mode, []).append(run)
    roles = {name: mode_from_label(name, staleness=1) for name in modes}
    baseline = [r for name, rs in modes.items() if roles[name].baseline for r in rs]
    sync_times = {r.seed: time_to_target(r.curve, config.target) for r in baseline}
    sync_folders = {r.seed: r.folder for r in baseline}
    summary = {}
    for name, mode_runs in modes.items():
        mode_runs.sort(key=lambda r: r.seed)
        times = [time_to_target(r.curve, config.target) for r in mode_runs]
        speedups = [_speedup(sync_times.get(r.seed), t) for r, t in zip(mode_runs, times)]
        summary[name] = {
            "seeds": [r.seed for r in mode_runs],
            "time_to_target_s": median_ci(times),
            "accuracy_at_budget": median_ci(
                [accuracy_at_budget(r.curve, budget) for r in mode_runs]
            ),
            "speedup_vs_sync": median_ci(speedups),
            "final_accuracy": median_ci([r.curve[-1].accuracy for r in mode_runs]),
            **_step_statistics(
                mode_runs, {} if roles[name].baseline or not roles[name].exact else sync_folders
            ),
        }
    return {
        "config": _config_dict(config),
        "placement": config.train.placement,  # every run's (train --placement)
        "target": config.target,
        "budget_s": budget,
        "initial_accuracy": initial_accuracy,
        "modes": summary,
        "verdicts": pair_verdicts(runs, config.target, budget),
        "runs": [
            {
                "mode": r.mode,
                "seed": r.seed,
                "folder": str(r.folder),
                "curve": [dataclasses.asdict(p) for p in r.curve],
            }
            for r in runs
        ],
    }


def _speedup(sync_time: float | None, mode_time: float | None) -> float | None:
    """T_sync / T_mode for one seed: 0 when the mode never reached the target, None (∞) when
    only sync never did (and None for sync itself then)."""
    if sync_time is None and mode_time is None:
        return None
    if mode_time is None:
        return 0.0
    if sync_time is None:
        return None
    return sync_time / mode_time if mode_time > 0 else None


def _step_statistics(runs: list[Any], sync_folders: dict[int, Path]) -> dict[str, Any]:
    """Step time, its breakdown (``BREAKDOWN``'s parts as fractions of the training time;
    tools and grading per episode), idle fractions, staleness and, for streaming, T*/T
    against the same seed's sync run."""
    metrics = [
        json.loads(line)
        for r in runs
        for line in (r.folder / "metrics.jsonl").read_text().splitlines()
    ]
    if not metrics:
        return {}
    total_s = sum(m["step_time_s"] for m in metrics)
    out: dict[str, Any] = {
        "step_time_s": statistics.median(m["step_time_s"] for m in metrics),
        # busy seconds over training seconds, summed over steps: a step's window can hold work
        # that began in the step before (async's next batch), which evens out over the run
        "breakdown_fraction": {
            name: sum(m["breakdown_s"].get(name, 0.0) for m in metrics) / total_s
            if total_s
            else None
            for name in BREAKDOWN
        },
        "tool_s_per_episode": statistics.median(
            m["breakdown_s"].get("tool", 0.0) / m["num_episodes"] for m in metrics
        ),
        "grading_s_per_episode": statistics.median(
            m["breakdown_s"].get("grading", 0.0) / m["num_episodes"] for m in metrics
        ),
        "learner_idle_fraction": _mean(m.get("learner_idle_fraction") for m in metrics),
        "engine_idle_fraction": _mean(m.get("engine_idle_fraction") for m in metrics),
    }
    histogram: dict[int, int] = {}
    for m in metrics:
        for k, v in (m["learner"].get("staleness_histogram") or {}).items():
            histogram[int(k)] = histogram.get(int(k), 0) + int(v)
    tokens = sum(histogram.values())
    out["staleness"] = {
        "mean": sum(k * v for k, v in histogram.items()) / tokens if tokens else 0.0,
        "max": max(histogram, default=0),
        "histogram": {str(k): v for k, v in sorted(histogram.items())},
    }
    out["clip_fraction"] = _mean(m["learner"].get("clip_fraction") for m in metrics)
    if sync_folders:  # b_i: the sync runs' batched learner cost, median over their seeds
        costs = [batched_cost(f) for f in sync_folders.values()]
        per_token = [c.per_token for c in costs if c.per_token is not None]
        cost = BatchedCost(
            statistics.median(c.per_item for c in costs),
            statistics.median(per_token) if len(per_token) == len(costs) else None,
        )
        efficiencies = [critical_path(run.folder, cost).get("efficiency") for run in runs]
        out["bound_efficiency"] = median_ci(efficiencies)
        out["cost_per_trajectory_s"] = cost.per_item
        out["cost_per_token_s"] = cost.per_token
    return out


def _mean(values: Any) -> float | None:
    numbers = [v for v in values if isinstance(v, int | float)]
    return statistics.mean(numbers) if numbers else None


def _config_dict(config: Any) -> dict[str, Any]:
    data = dataclasses.asdict(config)
    data["modes"] = list(config.modes)
    return data


def write_outputs(results: dict[str, Any], runs: list[Any], config: Any) -> None:
    """results.json (strict JSON) and the plots, all under ``config.out``."""

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    results["plots"] = [str(p) for p in write_plots(results, runs, out)]
    (out / "results.json").write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")


def verdict(results: dict[str, Any]) -> str:
    """Three plain lines (each fits 80 columns for the three modes): each mode's median time to
    the target, the median of its per-seed speed-ups over sync, then accuracy at the budget.

    The speed-up is paired within each seed (the seeds' machines drift apart more than the
    modes do), so it is not the ratio of the median times: it gets a line of its own that
    says what it is, never a place beside two times it could be mistaken for the ratio of."""
    modes, target = results["modes"], results["target"]
    seeds = max((len(m["time_to_target_s"]["per_seed"]) for m in modes.values()), default=0)
    times = ", ".join(f"{name} {_time(m)}" for name, m in modes.items())
    several = seeds > 1
    lines = [
        f"compare: {'median ' if several else ''}time to {target:g} "
        f"({seeds} seed{'s' if several else ''}): {times}"
    ]
    baseline = next((n for n in modes if mode_from_label(n, staleness=1).baseline), None)
    if baseline is not None and len(modes) > 1:
        speeds = ", ".join(f"{n} {_speedup_text(m)}" for n, m in modes.items() if n != baseline)
        per_seed = "median per-seed " if several else ""
        lines.append(f"compare: {per_seed}speed-up vs {baseline}: {speeds}")
    budget = ", ".join(f"{n} {_fmt(m['accuracy_at_budget']['median'])}" for n, m in modes.items())
    lines.append(f"compare: accuracy at {results['budget_s']:.0f} s: {budget}")
    return "\n".join(lines)


def _time(mode: dict[str, Any]) -> str:
    t = mode["time_to_target_s"]["median"]
    if t is None:
        return "never"
    return f"{t:.1f} s" if t < 10 else f"{t:.0f} s"


def _speedup_text(mode: dict[str, Any]) -> str:
    """The median per-seed speed-up; None is ∞ when the mode reached the target (sync never
    did), and "never" when the mode did not."""
    speed = mode["speedup_vs_sync"]["median"]
    if mode["time_to_target_s"]["median"] is None:
        return "never"
    return "∞ (sync never)" if speed is None else f"{speed:.2f}x"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
