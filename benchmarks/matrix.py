"""The training modes on five workloads through the real training loop, side by side in one run.

Each cell is a ``thundersync train`` run (same warm model, seed, batch and steps) of one
workload in one mode, read back from its run folder (docs/design.md §4):

- **step time**: sync and streaming, the median over steps (the first, a warm-up, left out)
  of a batch's submission to its step's end; async, its throughput once its pipeline is
  full, the median over windows of k + 1 step intervals (``harness.replay.step_time``); and
  T_sync / T_mode;
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

Every row runs in each ``--placements`` (default both: ``colocated``, learner and rollout on
all cores; ``disaggregated``, the learner on its own core, rollout and sandboxes on the rest),
one whole matrix per placement; ``--workloads`` and ``--no-budget`` run a subset.
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
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PLACEMENTS = ("colocated", "disaggregated")
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # its own modules, when loaded by path

from matrix_cells import (  # noqa: E402
    BASELINE,
    CELLS,
    CROSS_SOURCES,
    STALENESS,
    STREAMING,
    WORKLOADS,
    Workload,
)
from matrix_cells import HELD as HELD  # noqa: E402 (test_matrix.py reads it here)
from matrix_report import cross_error as cross_error  # noqa: E402 (test_matrix.py, too)
from matrix_report import paired as paired  # noqa: E402 (test_matrix.py, too)
from matrix_report import print_matrix  # noqa: E402

from harness.critical_path import (  # noqa: E402
    BatchedCost,
    batched_cost,
    bound,
    step_windows,
)
from harness.cross_prediction import predict_from_run  # noqa: E402
from harness.replay import replay_run  # noqa: E402
from thundersync.training.modes import mode_from_label  # noqa: E402


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
        *("--placement", getattr(args, "placement", "colocated")),
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
    parser.add_argument(
        "--placements",
        type=lambda s: s.split(","),
        default=list(PLACEMENTS),
        help="placements to run the matrix in (train --placement), of " + ",".join(PLACEMENTS),
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: unknown {','.join(unknown)}; known {','.join(WORKLOADS)}")
    if not set(args.placements) <= set(PLACEMENTS):
        parser.error(f"--placements: expected some of {','.join(PLACEMENTS)}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.steps < 5:
        parser.error("--steps must be >= 5 (async(2) replays from step 4 on)")
    from agent_loop import warm_model

    with tempfile.TemporaryDirectory(prefix="thundersync-matrix-") as tmp:
        folder = args.keep or Path(tmp)
        model = args.model or warm_model(folder, args.seed)
        result: dict[str, Any] = {"placements": {}}
        for placement in args.placements:
            args.placement = placement
            placed = run_matrix(model, folder / placement, args)
            result["placements"][placement] = {"placement": placement, **placed}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for placement, placed in result["placements"].items():
            print(f"placement: {placement}")
            print_matrix(placed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
