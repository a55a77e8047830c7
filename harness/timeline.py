"""``thundersync timeline RUN_DIR``: where each step's time went, and one step as a Gantt chart."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.plots import timeline_plot
from thundersync.cli_output import HelpFormatter
from thundersync.training.run_metrics import read_metrics


def add_timeline_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "timeline",
        help="a training run's step times, their breakdown and one step's chart",
        description="Print a training run's step times and what they were spent on (engine, "
        "tools and grading summed over the step's episodes, which run concurrently; the "
        "learner's backward and optimizer step; the learner's idle time), and draw one step's "
        "timeline (every episode's and the learner's spans) to a PNG.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("run", help="a thundersync train run folder")
    parser.add_argument(
        "--step",
        type=int,
        default=None,
        help="step to chart, counted from 1 as the console and checkpoints count "
        "(default: the middle one)",
    )
    parser.add_argument("--out", default=None, help="PNG to write (default: RUN/timeline.png)")
    parser.set_defaults(func=run_timeline_command)


def run_timeline_command(args: argparse.Namespace) -> int:

    run = Path(args.run)
    if not (run / "metrics.jsonl").is_file() or not (run / "spans.jsonl").is_file():
        print(
            f"timeline: error: {run}: not a run folder (no metrics.jsonl/spans.jsonl)",
            file=sys.stderr,
        )
        return 2
    metrics = read_metrics(run / "metrics.jsonl")
    if not metrics:
        print(f"timeline: error: {run}: no step finished yet", file=sys.stderr)
        return 2
    print(
        f"{'step':>4} {'time':>7} {'engine':>7} {'tools':>7} {'grading':>8} {'learner':>8} "
        f"{'learner idle':>12}"
    )
    for m in metrics:
        b = m["breakdown_s"]
        learner = b.get("backward", 0.0) + b.get("step", 0.0)
        idle = m.get("learner_idle_fraction")
        print(
            f"{m['step']:>4} {m['step_time_s']:>6.2f}s {b.get('engine', 0):>6.2f}s "
            f"{b.get('tool', 0):>6.2f}s {b.get('grading', 0):>7.2f}s {learner:>7.2f}s "
            f"{'-' if idle is None else f'{idle:.0%}':>12}"
        )
    out = Path(args.out) if args.out else run / "timeline.png"
    try:
        timeline_plot({metrics[0].get("mode", "run"): run}, out, args.step)
    except ValueError as exc:
        print(f"timeline: error: {exc}", file=sys.stderr)
        return 2
    shown = args.step if args.step is not None else metrics[len(metrics) // 2]["step"]
    print(
        f"timeline: {len(metrics)} steps of {run}; chart of step {shown} in {out} "
        "(tools and grading are summed over concurrent episodes)"
    )
    return 0
