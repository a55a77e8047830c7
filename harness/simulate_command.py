"""``thundersync simulate``'s command line: a named workload, a run folder, or a projection file
(``harness/simulate.py`` holds the model, ``harness/projection.py`` the projections;
docs/design.md §4)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from harness.cross_prediction import predict_from_run, target_step
from harness.projection import load_projection, print_projection, project
from harness.replay import replay_run
from harness.simulate import simulate
from harness.workload import named_workload, run_workload
from thundersync.cli_output import HelpFormatter


def add_simulate_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "simulate",
        help="predict sync, async and streaming step times for a workload",
        description="Predict each mode's step time (sync, async(k), streaming) and the bound "
        "T* (docs/design.md section 4) without training: from a named workload of simulated "
        "episode, tool and grading latencies (long-tail, balanced, agentic), or from the spans "
        "a thundersync train run recorded (its folder), with the learner cost per trajectory "
        "measured in a sync run; or project a cluster not rented yet from a file of stated "
        "inputs (--project: GPUs, throughputs, an episode distribution), printed as a "
        "projection beside its inputs and their sources.",
        formatter_class=HelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "run",
        nargs="?",
        default=None,
        metavar="RUN_DIR",
        help="a run folder of thundersync train, replayed (as timeline and export take one)",
    )
    source.add_argument(
        "--workload",
        help="long-tail, balanced, agentic, or a run folder of thundersync train",
    )
    source.add_argument(
        "--project",
        type=Path,
        metavar="FILE",
        help="a projection file (TOML: a cluster shape, a model's throughputs and an episode "
        "distribution, with their sources; benchmarks/projections/ has examples): prints "
        "projected step times, labelled as projections, beside their inputs",
    )
    source.add_argument(
        "--from",
        dest="from_run",
        type=Path,
        metavar="RUN",
        help="a run folder of any mode (GRPO): predict every registered mode's step time and "
        "time to the target from it, its ready times and learner costs fitted from its own "
        "spans, the rollout's contention with the learner measured where the run shows it",
    )
    parser.add_argument(
        "--contention",
        type=float,
        default=None,
        metavar="KAPPA",
        help="with --from: rollout runs 1 + KAPPA times slower while the learner computes "
        "(default: fitted from the run's engine spans; 0 where its learner never overlapped "
        "its rollout, as in a sync run)",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="with --from: the accuracy whose first step (from the comparison's results.json "
        "around the run) the time to the target is taken at",
    )
    parser.add_argument(
        "--at-step",
        type=int,
        default=None,
        help="with --from: the step the time to the target is taken at (default: --target's, "
        "else the run's last)",
    )
    parser.add_argument(
        "--early-start",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --from: predict a streaming learner with or without early start (default: "
        "as the run's config says)",
    )
    parser.add_argument(
        "--sync-run",
        default=None,
        help="a sync run folder whose learner cost b to use (default: the workload's run itself)",
    )
    parser.add_argument("--staleness", type=int, default=1, help="k of async(k)")
    parser.add_argument(
        "--steps", type=int, default=20, help="steps of a named workload or a projection"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of a named workload or a projection"
    )
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    parser.set_defaults(func=run_simulate_command)


def _jsonable(value: Any) -> Any:
    """JSON for a projection's inputs (its distributions)."""
    if hasattr(value, "__dataclass_fields__"):
        fields = {name: getattr(value, name) for name in value.__dataclass_fields__}
        return {k: None if v == math.inf else v for k, v in fields.items()}
    raise TypeError(f"not JSON: {value!r}")


def source_problem(args: Any) -> str | None:
    """Why the source given cannot be what its flag takes, naming the flag that takes it: a
    run folder given to ``--project``, a path to no folder as a workload, a folder that holds
    no run."""
    if getattr(args, "from_run", None) is not None:
        if not (args.from_run / "metrics.jsonl").is_file():
            return f"--from {args.from_run}: not a run folder (no metrics.jsonl)"
        return None
    if args.project is not None:
        if args.project.is_dir():
            what = "a run folder" if (args.project / "metrics.jsonl").is_file() else "a folder"
            return (
                f"--project {args.project} is {what}, not a projection file: give a run "
                f"folder as `thundersync simulate {args.project}`"
            )
        return None
    name = args.run if args.run is not None else args.workload
    folder = Path(name)
    if args.run is None and not folder.is_dir() and not _looks_like_a_path(name):
        return None  # a named workload (an unknown name is refused with the known ones)
    if not folder.is_dir():
        return f"{name}: no such run folder"
    if not (folder / "metrics.jsonl").is_file():
        return (
            f"{name}: not a run folder (no metrics.jsonl): give a folder thundersync train "
            "wrote (--out), or --workload long-tail|balanced|agentic, or --project FILE"
        )
    return None


def _looks_like_a_path(name: str) -> bool:
    return "/" in name or name.startswith((".", "~"))


def run_simulate_command(args: Any) -> int:
    import sys

    problem = source_problem(args)
    if problem:
        print(f"simulate: error: {problem}", file=sys.stderr)
        return 2
    if args.run is not None:
        args.workload = args.run
    if args.from_run is not None:
        return run_from(args)
    if args.project is not None:
        try:
            if args.staleness < 1 or args.steps < 1:
                raise ValueError("--staleness and --steps must be >= 1")
            result = project(
                load_projection(args.project),
                steps=args.steps,
                seed=args.seed,
                staleness=args.staleness,
            )
        except ValueError as exc:
            print(f"simulate: error: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(result, indent=2, default=_jsonable))
        else:
            print_projection(result)
        return 0
    replay: dict[str, Any] | str | None = None  # a run folder's replay in its own mode
    try:
        folder = Path(args.workload)
        if folder.is_dir():
            sync = Path(args.sync_run) if args.sync_run else None
            workload = run_workload(folder, sync)
            replay = _replay(folder)
        else:
            workload = named_workload(args.workload, steps=args.steps, seed=args.seed)
        if args.staleness < 1 or not workload.ready_s:
            raise ValueError("--staleness must be >= 1 and the workload needs steps")
        result = simulate(workload, staleness=args.staleness)
        if folder.is_dir():
            result["replay"] = replay
            _fitted(result, folder, sync, args.staleness)
    except (ValueError, OSError, KeyError) as exc:
        print(f"simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'mode':<18}{'step time':>11}{'vs sync':>9}")
    for mode, t in result["step_time_s"].items():
        speed = result["speedup_vs_sync"].get(mode)
        print(f"{mode:<18}{t:>9.3f} s{'' if speed is None else f'{speed:>8.2f}x'}")
    if isinstance(result.get("prediction"), dict):  # the modes' rows as --from predicts them
        print("simulate: the modes' rows fitted from the run's spans (as --from); the bound")
        print("simulate: and the eager drain from its reward times alone")
    else:
        print(
            f"simulate: {result['workload']}: streaming {result['step_time_s']['streaming']:.3f}"
            f" s per step, {result['efficiency']['streaming']:.3f} of the bound"
        )
    replay = result.get("replay")
    if isinstance(replay, dict):
        replayed = replay["mode"] + (", early start" if replay["early_start"] else "")
        print(
            f"simulate: the run replayed in its own mode ({replayed}, its costs from its spans): "
            f"predicted {replay['predicted_step_time_s']:.3f} s per step, measured "
            f"{replay['measured_step_time_s']:.3f} s ({replay['error']:+.1%})"
        )
    elif replay is not None:
        print(f"simulate: the run is not replayed in its own mode: {replay}")
    return 0


def _replay(folder: Path) -> dict[str, Any] | str:
    """The run replayed in its own mode (``replay_run``, what ``benchmarks/matrix.py`` checks
    against each run), or why it cannot be (too few steps)."""
    try:
        return replay_run(folder)
    except (ValueError, KeyError) as exc:
        return str(exc)


def _at_step(args: Any) -> int | None:
    if args.at_step is not None or args.target is None:
        return args.at_step
    step = target_step(args.from_run, args.target)
    if step is None:
        raise ValueError(
            f"--target {args.target}: no comparison's results.json around {args.from_run} "
            "says the run reached it; give --at-step"
        )
    return step


def run_from(args: Any) -> int:
    """``simulate --from RUN``: every registered mode predicted from the run."""
    import sys

    try:
        if args.staleness < 1:
            raise ValueError("--staleness must be >= 1")
        result = predict_from_run(
            args.from_run,
            staleness=(args.staleness,),
            contention=args.contention,
            at_step=_at_step(args),
            early_start=args.early_start,
        )
    except (ValueError, OSError, KeyError) as exc:
        print(f"simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    at = result["at_step"]
    print(f"{'mode':<14}{'step time':>11}{'to step ' + str(at):>14}{'measured':>11}")
    for label, p in result["modes"].items():
        measured = p.get("measured_step_time_s")
        mark = "" if p["same_updates"] else " *"
        print(
            f"{label:<14}{p['step_time_s']:>9.3f} s{p['time_to_step_s']:>12.1f} s"
            + (f"{measured:>9.3f} s ({p['error']:+.1%})" if measured is not None else "")
            + mark
        )
    kappa = result["contention"]
    how = "fitted from its engine spans" if kappa["measured"] else "not measured in this run"
    print(f"* other updates than the run's: timed to the same step ({at}) on the run's own")
    print("  episodes; its own policy's may differ (async's, on stale tokens, stayed longer on")
    print("  the matrix) and its engine, generating for batches at different turns, be slower")
    print("  per token (docs/measurements.md, 2026-12-07)")
    print(f"contention kappa {kappa['kappa']:.2f}: {how}; early start {result['early_start']}")
    loads = result["loads"]
    if loads["mean_share"] is None:
        print("rollout load: not recorded in this run: batches in flight together (async) are")
        print("  predicted not to slow each other")
    else:
        print(
            f"rollout load: said for {loads['said']} of {loads['batches']} batches, "
            f"{loads['mean_share']:.2f} of the rollout's cores on average:"
        )
        print("  batches in flight together (async) share them")
    if result["learner_load"] is not None:
        print(
            f"learner load: {result['learner_load']:.2f} of the rollout's cores while it computes "
            "alone: it shares them with the rollout where their loads add past 1 (in place of "
            "kappa)"
        )
    print(f"simulate: every mode predicted from the {result['from_mode']} run {result['run']}")
    return 0


def _fitted(result: dict[str, Any], folder: Path, sync: Path | None, staleness: int) -> None:
    """A run folder's step times per mode as ``--from`` predicts them (its learner costs from
    ``sync`` where given), in place of the reward-times-only model's, where the run allows
    (a GRPO run whose events record the trajectories' lengths); ``prediction`` says which."""
    try:
        fitted = predict_from_run(folder, staleness=(staleness,), costs_from=sync)
    except (ValueError, KeyError) as exc:
        result["prediction"] = f"the reward times and b alone: {exc}"
        return
    times = result["step_time_s"]
    times.update({label: p["step_time_s"] for label, p in fitted["modes"].items()})
    base = next(label for label, p in fitted["modes"].items() if p["baseline"])
    result["speedup_vs_sync"] = {k: times[base] / v for k, v in times.items() if k != "bound"}
    result["prediction"] = fitted
