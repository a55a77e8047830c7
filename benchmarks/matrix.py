"""The training modes on five workloads through the real training loop, side by side in one run.

Each cell is a ``thundersync train`` run (same warm model, seed, batch and steps) of one
workload in one mode, read back from its run folder (docs/design.md §4):

- **step time**: sync and streaming, the median over steps (the first, a warm-up, left out)
  of a batch's submission to its step's end; async, the mean interval between step ends once
  its pipeline is full (its throughput); and T_sync / T_mode;
- **T*/T** for streaming against two bounds: the *per-trajectory* bound charges each work item
  (a trajectory; an OPD turn) what one costs alone, o + b, with o and b fitted to the run's own
  backward passes by the replay (GRPO: o per micro-batch, b a lone piece of the run's mean
  length, from costs per padded token; OPD: a pass of k turns costs o + k·b); the *strict*
  bound charges it its share of the batched learner time measured in the workload's sync run,
  by its tokens (L_sync · nᵢ / Σ n; L_sync / N per OPD turn), as if streaming lost nothing to
  small passes;
- **idle fractions** of the learner and of the engine (rollout) per step;
- **peak accumulator memory** in multiples of the trainable parameters (against 2·open groups
  + 1, and against ``--buffer-budget-bytes`` in the budget cell);
- **the simulator's replay**: ``harness.replay.replay_run`` predicts the run's step time from
  its own ready times and learner costs; its error beside the measurement;
- **cross-predictions** (``x-sync``, ``x-strm``): each cell's step time predicted from the
  row's sync run and from its streaming run alone (``simulate --from``,
  ``harness/cross_prediction.py``), its error against the cell's measurement.

Workloads (ToySum, warm model, B tasks × G episodes per step):

- ``balanced``: every episode's grading log-normal (σ = 1) with its median set so the rollout's
  makespan is about the sync learner's time (the printed makespan / L_sync says how close);
- ``long-tail``: the demo's (log-normal tool calls and grading);
- ``long-grading``: every episode's grading about as long as the sync learner's time (σ 0.25;
  SWE-like: a repository's tests take minutes, like the episode and the learner's pass over a
  batch of long trajectories), where early start overlaps the backward with the grading; a
  sixth mode, ``streaming-early-held``, runs early start under a budget that holds every
  trajectory's whole piece to its reward instead of splitting its work (docs/design.md §3):
  the time that memory buys;
- ``opd``: multi-turn on-policy distillation with tool latency (per-turn gradients while tools
  run; the teacher is the warm model itself, so the KL is 0 but every piece of work is done);
- ``no-overlap``: instant tools and grading, so every episode ends at about the same time and
  there is nothing to overlap (streaming must not be slower than sync).

Ratios are measured side by side in one run (run it on a quiet machine): one run's ratio moves
10-15 % with the machine between its cells; ``--repeats R`` runs each cell R times, the modes
in turn, and pairs each ratio within its repeat (``run_row``). ``--json`` prints every number.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.critical_path import (  # noqa: E402
    BatchedCost,
    batched_cost,
    bound,
    step_windows,
)
from harness.cross_prediction import predict_from_run  # noqa: E402
from harness.replay import replay_run  # noqa: E402
from thundersync.training.modes import REGISTRY, Mode, baseline_mode, mode_from_label  # noqa: E402

STALENESS = (1, 2)
"""The staleness bounds the matrix runs a mode that takes one at (async)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One column of the matrix: a registered mode (``--mode``'s fields from the mode object),
    and for a streaming one early start, and early start holding every piece to its reward
    under a budget with room for them (``held``)."""

    mode: Mode
    early_start: bool = False
    held: bool = False

    @property
    def name(self) -> str:
        return self.mode.label + "-early" * self.early_start + "-held" * self.held

    @property
    def streams(self) -> bool:
        return self.mode.learner_contract().streams

    def flags(self) -> list[str]:
        fields = self.mode.train_fields().items()
        flags = [word for k, v in fields for word in (f"--{k.replace('_', '-')}", str(v))]
        if self.streams:
            flags.append("--early-start" if self.early_start else "--no-early-start")
        return flags


def _cells() -> dict[str, Cell]:
    """Every registered mode (one per staleness bound it takes), then a streaming mode's
    early-start variants, in the registry's order."""
    cells: list[Cell] = []
    for cls in REGISTRY:
        modes = [cls.from_label(cls.name, staleness=k) for k in STALENESS]
        for mode in {m.label: m for m in modes if m is not None}.values():
            cells.append(Cell(mode))
            if cells[-1].streams:
                cells += [Cell(mode, early_start=True), Cell(mode, early_start=True, held=True)]
    return {c.name: c for c in cells}


CELLS = _cells()
BASELINE = baseline_mode().label
"""The cell every ratio is against (sync)."""
STREAMING = next(name for name, c in CELLS.items() if c.streams and not c.early_start)
EARLY = next(name for name, c in CELLS.items() if c.early_start and not c.held)
HELD = next(name for name, c in CELLS.items() if c.held)
"""The streaming mode's cells the verdicts read: reward-triggered, early start, held."""
MODES = tuple(name for name, c in CELLS.items() if not c.held)


@dataclass(frozen=True, slots=True)
class Workload:
    """One row of the matrix: ToySum's latency knob and the algorithm."""

    name: str
    env_kwargs: dict[str, Any]
    algo: str = "grpo"
    modes: tuple[str, ...] = MODES
    warm: bool = True
    """Train the warm model (False: ``train``'s tiny random model, whose actions are all format
    errors, so every episode ends after the same turns, in the same generation batch)."""


WORKLOADS = {
    w.name: w
    for w in (
        Workload("balanced", {"tools": "python", "grade_latency_sigma": 1.0}),
        Workload(
            "long-tail",
            {
                "tools": "python",
                "tool_latency_s": 0.05,
                "tool_latency_sigma": 1.0,
                "grade_latency_s": 0.3,
                "grade_latency_sigma": 0.75,
            },
        ),
        Workload(
            "long-grading",
            {"tools": "python", "grade_latency_sigma": 0.25},
            modes=tuple(CELLS),
        ),
        Workload(
            "opd",
            {"tools": "python", "tool_latency_s": 0.1, "tool_latency_sigma": 0.5},
            algo="opd",
            modes=tuple(n for n, c in CELLS.items() if c.mode.exact and not c.early_start),
        ),
        Workload("no-overlap", {"tools": "python"}, warm=False),
    )
}
"""The matrix's rows. OPD has no async (the learner refuses off-policy OPD) and no early start
(its turns' gradients already start at each teacher score)."""


def train(
    out: Path,
    model: Path,
    workload: Workload,
    mode: str,
    args: argparse.Namespace,
    extra: list[str] | None = None,
) -> Path:
    """One cell: ``thundersync train`` of ``workload`` in ``mode`` into ``out``."""
    command = [
        *(sys.executable, "-m", "thundersync.cli", "train", *CELLS[mode].flags()),
        *(("--model", str(model)) if workload.warm else ()),
        *("--out", str(out), "--algo", workload.algo),
        *("--steps", str(args.steps), "--seed", str(args.seed)),
        *("--tasks-per-step", str(args.tasks), "--group-size", str(args.group)),
        *("--max-new-tokens", "16", "--lr", "1e-3", "--checkpoint-every", str(args.steps)),
        *("--env-kwargs", json.dumps(workload.env_kwargs)),
        *(["--objective", json.dumps({"kl_coef": 0.04})] if workload.algo == "grpo" else []),
        *(["--teacher", str(model)] if workload.algo == "opd" else []),
        *(held(model, args) if CELLS[mode].held else []),
        *("--device", getattr(args, "device", "cpu")),
        *(extra or []),
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"matrix: {workload.name} {mode} failed:\n{done.stdout}\n{done.stderr}")
    print(f"matrix: {workload.name} {mode}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return out


def held(model: Path, args: argparse.Namespace) -> list[str]:
    """A budget with room for every trajectory's piece (hᵢ, kᵢ) besides the groups' sums:
    early start then holds each to its reward instead of splitting (docs/design.md §3)."""
    copies = 2 * args.tasks * args.group + 2 * args.tasks + 1
    return ["--buffer-budget-bytes", str(copies * parameter_bytes(model))]


def cell(run: Path, *, strict_cost: BatchedCost | None) -> dict[str, Any]:
    """The numbers of one run (its first step, the warm-up, left out)."""
    config = json.loads((run / "config.json").read_text())
    windows = step_windows(run)[1:]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][1:]
    simulated = replay_run(run)
    out: dict[str, Any] = {
        "step_time_s": simulated["measured_step_time_s"],
        "step_times_s": [w.time_s for w in windows],
        "learner_idle": statistics.mean(m["learner_idle_fraction"] for m in metrics),
        "engine_idle": statistics.mean(m["engine_idle_fraction"] for m in metrics),
        "makespan_s": statistics.median(
            max(w.work_times) - w.submitted_at for w in windows if w.work_times
        ),
        "learner_s": statistics.median(w.learner_time_s for w in windows),
        "peak_accumulators": max(
            m["learner"]["peak_buffer_bytes"] / m["learner"]["buffer_bytes"] for m in metrics
        ),
        "peak_buffer_bytes": max(m["learner"]["peak_buffer_bytes"] for m in metrics),
        "buffer_bytes": metrics[0]["learner"]["buffer_bytes"],
        "open_groups_bound": 2 * (config["tasks_per_step"]) + 1,
        "buffer_budget_bytes": config.get("buffer_budget_bytes") or None,
        "simulated": simulated,
    }
    mode = mode_from_label(config["mode"], staleness=int(config.get("staleness", 1)))
    if mode.learner_contract().streams:
        early = bool(config.get("early_start"))
        # the replay fitted o and b to the same passes
        o, b = simulated["pass_overhead_s"], simulated["cost_per_item_s"]
        lone = [bound(w, o + b, early_start=early) for w in windows]
        out["pass_overhead_s"], out["cost_per_item_s"] = o, b
        out["efficiency"] = statistics.median(t / w.time_s for t, w in zip(lone, windows))
        if strict_cost is not None:
            strict = [bound(w, strict_cost, early_start=early) for w in windows]
            out["efficiency_strict"] = statistics.median(
                t / w.time_s for t, w in zip(strict, windows)
            )
            out["strict_bound_s"] = statistics.median(strict)
    return out


def lognormal_max(n: int, sigma: float = 1.0) -> float:
    """The median of the largest of n log-normal draws (σ = ``sigma``), in medians."""
    import numpy as np

    draws = np.random.default_rng(0).normal(size=(4000, n)) * sigma
    return float(np.median(np.exp(draws).max(axis=1)))


def probe(model: Path, folder: Path, args: argparse.Namespace) -> tuple[float, float]:
    """(L_sync, rollout makespan) of a short sync run with instant tools and grading."""
    instant = Workload("probe", {"tools": "python"})
    windows = step_windows(train(folder / "probe", model, instant, BASELINE, args))[1:]
    learner = statistics.median(w.learner_time_s for w in windows)
    rollout = statistics.median(max(w.work_times) - w.submitted_at for w in windows)
    print(
        f"matrix: probe: L_sync {learner:.3f} s, rollout without latency {rollout:.3f} s",
        file=sys.stderr,
    )
    return learner, rollout


def calibrated(name: str, learner: float, rollout: float, episodes: int) -> Workload:
    """The rows sized from the probe. ``balanced``: the grading's median set so the expected
    largest of the batch's log-normal gradings fills the gap between the rollout and L_sync,
    making the makespan about the sync learner's time. ``long-grading``: every episode's
    grading about as long as L_sync (σ 0.25), as in SWE-like work where a repository's tests
    take minutes, like the agent's episode and the learner's pass over a batch of long
    trajectories."""
    kwargs = dict(WORKLOADS[name].env_kwargs)
    if name == "balanced":
        kwargs["grade_latency_s"] = round(
            max((learner - rollout) / lognormal_max(episodes), 0.005), 4
        )
    else:
        kwargs["grade_latency_s"] = round(learner, 4)
    print(
        f"matrix: {name}: grading median {kwargs['grade_latency_s'] * 1000:.1f} ms", file=sys.stderr
    )
    return replace(WORKLOADS[name], env_kwargs=kwargs)


def run_row(model: Path, folder: Path, workload: Workload, args: argparse.Namespace) -> dict:
    """One row: a run per mode, or with ``--repeats R`` R runs per mode, interleaved (the modes
    in order, then in reverse, ...) so that the machine's drift between runs hits every mode
    alike. Each ratio is paired within its repeat (a mode's run against that repeat's sync
    run); a cell reports the median of its R ratios, every repeat's beside it, and the numbers
    of its median run."""
    repeats: list[dict[str, dict[str, Any]]] = []
    strict_costs = []
    for r in range(args.repeats):
        order = workload.modes if r % 2 == 0 else workload.modes[::-1]
        under = folder / workload.name
        if args.repeats > 1:
            under = under / f"repeat-{r}"
        runs = {mode: train(under / mode, model, workload, mode, args) for mode in order}
        strict_cost = batched_cost(runs[BASELINE])
        cells = {mode: cell(runs[mode], strict_cost=strict_cost) for mode in workload.modes}
        for mode, numbers in cells.items():
            numbers["cross"] = cross_predictions(runs, mode, numbers["step_time_s"])
        for numbers in cells.values():
            numbers["speedup_vs_sync"] = cells[BASELINE]["step_time_s"] / numbers["step_time_s"]
        repeats.append(cells)
        strict_costs.append(strict_cost)
    row = {
        mode: median_cell(
            [cells[mode] for cells in repeats],
            by="step_time_s" if mode == BASELINE else "speedup_vs_sync",
        )
        for mode in workload.modes
    }
    return {
        "env_kwargs": workload.env_kwargs,
        "algo": workload.algo,
        "strict_cost_per_item_s": statistics.median(c.per_item for c in strict_costs),
        "strict_cost_per_token_s": median_or_none([c.per_token for c in strict_costs]),
        "makespan_over_learner": row[BASELINE]["makespan_s"] / row[BASELINE]["learner_s"],
        "modes": row,
    }


CROSS_SOURCES = (BASELINE, STREAMING)
"""The cells each cell is predicted from (``simulate --from``): the sync run, the streaming run."""


def cross_predictions(runs: dict[str, Path], mode: str, measured: float) -> dict[str, Any]:
    """Cell ``mode``'s step time predicted from each of ``CROSS_SOURCES``' runs in this row
    (``harness.cross_prediction``), with its error against the cell's measurement; a source
    that cannot predict it (OPD, early start holding its pieces) says why."""
    target = CELLS[mode]
    out: dict[str, Any] = {}
    for source in CROSS_SOURCES:
        if source not in runs:
            continue
        if target.held:
            out[source] = "early start holding every piece is not predicted"
            continue
        try:
            result = predict_from_run(
                runs[source], staleness=STALENESS, early_start=target.early_start
            )
        except (ValueError, KeyError) as exc:
            out[source] = str(exc)
            continue
        predicted = result["modes"][target.mode.label]["step_time_s"]
        out[source] = {
            "predicted_step_time_s": predicted,
            "error": predicted / measured - 1.0,
            "contention": result["contention"]["kappa"],
        }
    return out


def median_or_none(values: list[float | None]) -> float | None:
    return None if None in values else statistics.median(values)


def median_cell(runs: list[dict[str, Any]], *, by: str) -> dict[str, Any]:
    """A cell's repeats as one: the numbers of the run whose ``by`` is the median, with the
    median ratio, and every repeat's ratio and step time (``repeat_speedups``,
    ``repeat_step_times_s``, in repeat order)."""
    middle = sorted(runs, key=lambda r: r[by])[len(runs) // 2]
    return {
        **middle,
        "speedup_vs_sync": statistics.median(r["speedup_vs_sync"] for r in runs),
        "repeat_speedups": [r["speedup_vs_sync"] for r in runs],
        "repeat_step_times_s": [r["step_time_s"] for r in runs],
    }


def paired(slower: dict[str, Any], faster: dict[str, Any]) -> float:
    """The median over repeats of ``slower``'s step time over ``faster``'s in the same repeat."""
    pairs = zip(slower["repeat_step_times_s"], faster["repeat_step_times_s"], strict=True)
    return statistics.median(a / b for a, b in pairs)


def run_matrix(model: Path, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"workloads": {}, "repeats": args.repeats}
    sized = [name for name in args.workloads if name in ("balanced", "long-grading")]
    learner, rollout = probe(model, folder, args) if sized else (0.0, 0.0)
    for name in args.workloads:
        workload = WORKLOADS[name]
        if name in sized:
            workload = calibrated(name, learner, rollout, args.tasks * args.group)
        result["workloads"][name] = run_row(model, folder, workload, args)
    if args.budget:
        # streaming under a cap of 3 parameter copies: the learner must stay below it
        long_tail = result["workloads"].get("long-tail", {}).get("modes", {})
        copy = long_tail.get(STREAMING, {}).get("buffer_bytes") or parameter_bytes(model)
        budget = 3 * copy
        run = train(
            folder / "budget",
            model,
            WORKLOADS["long-tail"],
            STREAMING,
            args,
            ["--buffer-budget-bytes", str(budget)],
        )
        numbers = cell(run, strict_cost=None)
        result["budget"] = {"budget_bytes": budget, **numbers}
    return result


def parameter_bytes(model: Path) -> int:
    """Bytes of one float32 copy of the model's parameters."""
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), framework="pt") as weights:
        names = list(weights.keys())
        return 4 * sum(math.prod(weights.get_slice(name).get_shape()) for name in names)


def print_matrix(result: dict[str, Any]) -> None:
    header = (
        f"{'workload':<13}{'mode':<21}{'step':>8}{'T_sync/T':>9}{'T*/T':>7}{'strict':>7}"
        f"{'learner':>8}{'engine':>7}{'accum':>7}{'sim':>8}{'err':>7}{'x-sync':>8}{'x-strm':>8}"
    )
    print(header)
    print(
        f"{'':<34}{'(s)':>8}{'':>9}{'':>7}{'':>7}{'idle':>8}{'idle':>7}{'(×θ)':>7}{'(s)':>8}"
        f"{'':>7}{'err':>8}{'err':>8}"
    )
    for name, row in result["workloads"].items():
        for mode, c in row["modes"].items():
            eff = f"{c['efficiency']:.3f}" if "efficiency" in c else "-"
            strict = f"{c['efficiency_strict']:.3f}" if "efficiency_strict" in c else "-"
            sim = c["simulated"]
            print(
                f"{name:<13}{mode:<21}{c['step_time_s']:>8.3f}{c['speedup_vs_sync']:>9.2f}"
                f"{eff:>7}{strict:>7}{c['learner_idle']:>8.0%}{c['engine_idle']:>7.0%}"
                f"{c['peak_accumulators']:>7.1f}{sim['predicted_step_time_s']:>8.3f}"
                f"{sim['error']:>+7.0%}{cross_error(c, BASELINE):>8}{cross_error(c, STREAMING):>8}"
            )
        per_token, per_item = row.get("strict_cost_per_token_s"), row["strict_cost_per_item_s"]
        charge = f"{per_item * 1000:.1f} ms per item"
        charge = f"{per_token * 1e6:.1f} us per token" if per_token is not None else charge
        print(
            f"{'':<13}makespan / L_sync {row['makespan_over_learner']:.2f}; strict bound "
            f"charges {charge}"
        )
        if result.get("repeats", 1) > 1:
            ratios = "; ".join(
                f"{mode} " + ", ".join(f"{x:.2f}" for x in c["repeat_speedups"])
                for mode, c in row["modes"].items()
                if mode != BASELINE
            )
            print(f"{'':<13}T_sync/T per repeat: {ratios}")
    if "budget" in result:
        b = result["budget"]
        print(
            f"budget: streaming under --buffer-budget-bytes {b['budget_bytes']}: peak "
            f"{b['peak_buffer_bytes']} bytes ({b['peak_accumulators']:.1f} copies), step "
            f"{b['step_time_s']:.3f} s"
        )
    print_verdicts(result)


def cross_error(c: dict[str, Any], source: str) -> str:
    predicted = c.get("cross", {}).get(source)
    return f"{predicted['error']:+.0%}" if isinstance(predicted, dict) else "-"


def print_verdicts(result: dict[str, Any]) -> None:
    """The issue's targets (issue 17), each with the measured value."""
    rows = result["workloads"]
    lines = []

    def best_streaming(row: dict[str, Any]) -> dict[str, Any]:
        candidates = [row["modes"][m] for m in (STREAMING, EARLY) if m in row["modes"]]
        return max(candidates, key=lambda c: c["speedup_vs_sync"])

    if "balanced" in rows:
        best, ceiling = best_streaming(rows["balanced"]), ""
        if "strict_bound_s" in best:  # what any exact schedule could reach on these batches
            limit = rows["balanced"]["modes"][BASELINE]["step_time_s"] / best["strict_bound_s"]
            ceiling = f"; the strict bound allows {limit:.2f}"
        lines.append(
            f"balanced T_sync/T_streaming {best['speedup_vs_sync']:.2f} (target >= 1.9{ceiling})"
        )
    for name, row in rows.items():
        for mode in (STREAMING, EARLY, HELD):
            c = row["modes"].get(mode)
            if c and "efficiency" in c:
                lines.append(
                    f"{name} {mode} T*/T {c['efficiency']:.3f} (>= 0.97), strict "
                    f"{c.get('efficiency_strict', float('nan')):.3f} (>= 0.9)"
                )
    if "long-grading" in rows:
        modes = rows["long-grading"]["modes"]
        if STREAMING in modes and EARLY in modes:
            gain = paired(modes[STREAMING], modes[EARLY])
            lines.append(f"long-grading early start {gain:.2f}x reward-triggered (>= 1.2)")
        if STREAMING in modes and HELD in modes:
            c = modes[HELD]
            gain = paired(modes[STREAMING], c)
            lines.append(
                f"long-grading early start holding every piece {gain:.2f}x reward-triggered, "
                f"at {c['peak_accumulators']:.1f} copies"
            )
    if "no-overlap" in rows:
        modes = rows["no-overlap"]["modes"]
        ratio = paired(best_streaming(rows["no-overlap"]), modes[BASELINE])
        lines.append(f"no-overlap T_streaming/T_sync {ratio:.3f} (<= 1.05)")
    for name, row in rows.items():
        for mode, c in row["modes"].items():
            if c.get("buffer_budget_bytes"):  # a set budget is the bound
                over = c["peak_buffer_bytes"] > c["buffer_budget_bytes"]
                lines.append(f"{name} {mode} budget held: {not over}")
            elif c["peak_accumulators"] > c["open_groups_bound"]:
                lines.append(
                    f"{name} {mode} accumulators {c['peak_accumulators']:.1f} copies "
                    f"(bound {c['open_groups_bound']})"
                )
    if "budget" in result:
        b = result["budget"]
        held = b["peak_buffer_bytes"] <= b["budget_bytes"]
        lines.append(f"budget held: {held}")
    errors = [abs(c["simulated"]["error"]) for row in rows.values() for c in row["modes"].values()]
    if errors:
        lines.append(f"simulator worst error {max(errors):.1%} (target <= 10%)")
    for source in CROSS_SOURCES:
        crossed = [
            abs(p["error"])
            for row in rows.values()
            for c in row["modes"].values()
            if isinstance(p := c.get("cross", {}).get(source), dict)
        ]
        if crossed:
            lines.append(
                f"predicted from the {source} run: worst error {max(crossed):.1%} over "
                f"{len(crossed)} cells (target <= 10%)"
            )
    for line in lines:
        print(f"matrix: {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=None, help="checkpoint (default: warm start)")
    parser.add_argument(
        "--steps", type=int, default=8, help="steps per cell (the first is warm-up)"
    )
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step (B)")
    parser.add_argument("--group", type=int, default=8, help="episodes per task (G)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run")
    parser.add_argument(
        "--workloads",
        type=lambda s: s.split(","),
        default=list(WORKLOADS),
        help=f"rows to run, of {','.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--budget",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run long-tail streaming under --buffer-budget-bytes of 3 parameter copies",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per cell, interleaved across modes; ratios paired within each repeat and "
        "reported as their median (a noisy machine moves one run's ratio by 10-15 %%)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where every cell's learner, reference and engine compute (cpu, cuda, cuda:N)",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: unknown {','.join(unknown)}; known {','.join(WORKLOADS)}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.steps < 5:
        parser.error("--steps must be >= 5 (async(2) replays from step 4 on)")
    from agent_loop import warm_model

    with tempfile.TemporaryDirectory(prefix="thundersync-matrix-") as tmp:
        folder = args.keep or Path(tmp)
        model = args.model or warm_model(folder, args.seed)
        result = run_matrix(model, folder, args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_matrix(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
