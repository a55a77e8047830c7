"""``thundersync compare``'s command line: the comparison's flags plus every training flag."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.compare import CompareConfig, mode_config, run_compare
from harness.eval import output_problem
from thundersync.cli_output import HelpFormatter
from thundersync.strict_json import dumps_refusing
from thundersync.training.config import (
    add_config_flags,
    check_inputs,
    json_object,
    load_config_file,
    resolve_config,
)

_OWN = ("mode", "out", "checkpoint_every", "keep_checkpoints")


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="time-to-accuracy of sync, async(k) and streaming training, over seeds",
        description="Train one workload in several modes and seeds, evaluate every run's "
        "checkpoints on one held-out task set, and report time to the target accuracy and "
        "accuracy at a fixed budget (medians with bootstrap CIs), speed-ups over sync, "
        "step-time breakdowns and plots. Training flags (--env, --model, --steps, ...) "
        "apply to every run.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--modes", default="sync,async,streaming",
                        help="comma-separated: sync, streaming, async (with --staleness) or "
                             "async-k<K>")  # fmt: skip
    parser.add_argument("--seeds", type=int, default=3, help="runs per mode")
    parser.add_argument("--target", type=float, default=0.8, help="target held-out accuracy")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="training seconds for accuracy-at-budget (default: the "
                             "shortest run)")  # fmt: skip
    parser.add_argument("--eval-every", type=int, default=2, help="steps between checkpoints")
    parser.add_argument("--eval-tasks", type=int, default=32, help="held-out tasks")
    parser.add_argument("--eval-samples", type=int, default=1, help="attempts per task")
    parser.add_argument("--eval-env-kwargs", type=json_object, default=None, metavar="JSON",
                        help="env keyword arguments for the evaluation (default: the "
                             "training's --env-kwargs)")  # fmt: skip
    parser.add_argument("--out", default="runs/compare", help="results, plots and runs")
    parser.add_argument("--config", default=None, help="JSON/TOML file of training fields")
    parser.add_argument("--json", action="store_true", help="print results.json")
    parser.add_argument(
        "--db",
        default=None,
        help="leaderboard file (default: $THUNDERSYNC_LEADERBOARD or runs/leaderboard.sqlite)",
    )
    parser.add_argument(
        "--no-leaderboard",
        action="store_true",
        help="do not append the comparison to the leaderboard",
    )
    add_config_flags(parser, exclude=_OWN)
    parser.set_defaults(func=run_compare_command)


def run_compare_command(args: argparse.Namespace) -> int:
    """0 when every run finished; 1 when a run failed; 2 on bad input."""
    from dataclasses import replace

    from harness.compare_report import verdict

    try:
        base = load_config_file(args.config) if args.config else {}
        train = resolve_config(args, {k: v for k, v in base.items() if k not in _OWN})
        config = CompareConfig(
            train=replace(train, out=args.out), modes=tuple(args.modes.split(",")),
            seeds=args.seeds, target=args.target, budget_s=args.budget_s,
            eval_every=args.eval_every, eval_tasks=args.eval_tasks,
            eval_samples=args.eval_samples, eval_env_kwargs=args.eval_env_kwargs, out=args.out,
            leaderboard=not args.no_leaderboard, leaderboard_db=args.db,
        )  # fmt: skip
        for mode in config.modes:
            mode_config(config.train, mode, 0, Path(config.out), 1)
        _check(config)
        check_inputs(config.train)
        dumps_refusing(config.train.to_dict(), what="config")  # each run's config.json
        problem = output_problem(args.out, args.db, leaderboard=not args.no_leaderboard)
        if problem is not None:
            raise ValueError(problem)
    except (ValueError, TypeError) as exc:
        print(f"compare: error: {exc}", file=sys.stderr)
        return 2
    try:
        results = run_compare(config)
    except RuntimeError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results, indent=2))
        print(verdict(results), file=sys.stderr)
    else:
        _print_table(results)
        print(f"compare: results, plots and runs in {config.out}")
        print(verdict(results))
    return 0


def _check(c: CompareConfig) -> None:
    if min(c.seeds, c.eval_every, c.eval_tasks, c.eval_samples) < 1:
        raise ValueError("--seeds, --eval-every, --eval-tasks and --eval-samples must be >= 1")
    if not 0.0 < c.target <= 1.0:
        raise ValueError(f"--target: expected an accuracy in (0, 1], got {c.target}")
    if "sync" not in c.modes:
        raise ValueError("--modes must include sync (speed-ups are relative to it)")


def _print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    def ci(stat: dict, unit: str = "") -> str:
        if stat["median"] is None:
            return "never"
        lo, hi = (("∞" if v is None else f"{v:.2f}") for v in stat["ci"])
        return f"{stat['median']:.2f}{unit} [{lo}, {hi}]"

    table = Table(title=f"time to accuracy {results['target']:g} · accuracy at "
                        f"{results['budget_s']:.0f} s · medians [95% CI] over seeds")  # fmt: skip
    for column in ("mode", "time to target (s)", "acc @ budget", "speed-up", "step (s)",
                   "learner idle", "T*/T"):  # fmt: skip
        table.add_column(column)
    for name, m in results["modes"].items():
        eff = m.get("bound_efficiency", {}).get("median")
        idle = m.get("learner_idle_fraction")
        table.add_row(
            name, ci(m["time_to_target_s"]), ci(m["accuracy_at_budget"]),
            ci(m["speedup_vs_sync"], "x"), f"{m.get('step_time_s', 0):.2f}",
            "-" if idle is None else f"{idle:.0%}", "-" if eff is None else f"{eff:.2f}",
        )  # fmt: skip
    Console(width=120).print(table)
