"""``thundersync compare``'s command line: the comparison's flags plus every training flag."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from harness.compare import (
    COMPARE_FLAGS,
    CompareConfig,
    clear_outputs,
    out_problem,
    run_compare,
)
from harness.compare_report import verdict
from harness.eval_checks import output_problem
from harness.verdicts import verdict_lines
from thundersync.cli_output import HelpFormatter
from thundersync.declared import add_flags, parse_flag
from thundersync.protocol.strict_json import dumps_refusing
from thundersync.training.checks import check_inputs, with_model_folders
from thundersync.training.config_files import (
    add_config_flags,
    load_config_file,
    resolve_config,
)
from thundersync.training.modes import REGISTRY

_OWN = ("mode", "out", "checkpoint_every", "keep_checkpoints")
_NUMBERS = (
    "seeds",
    "target",
    "budget_s",
    "eval_every",
    "eval_tasks",
    "eval_samples",
    "eval_env_kwargs",
)
"""CompareConfig fields whose flags come from its declaration."""


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="time-to-accuracy of sync, async(k) and streaming training, over seeds",
        description="Train one workload in several modes and seeds, evaluate every run's "
        "checkpoints on one held-out task set, and report time to the target accuracy and "
        "accuracy at a fixed budget (medians with distribution-free CIs), speed-ups over sync, "
        "step-time breakdowns and plots. Training flags (--env, --model, --steps, ...) "
        "apply to every run.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--modes",
        default=",".join(cls.name for cls in REGISTRY),
        help="comma-separated: " + ", ".join(cls.label_forms for cls in REGISTRY),
    )
    add_flags(parser, CompareConfig, _NUMBERS, flags=COMPARE_FLAGS)
    parser.add_argument("--out", default="runs/compare", help="results, plots and runs")
    parser.add_argument("--config", default=None, help="JSON/TOML file of training fields")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the comparison in --out: remove what a comparison wrote there first "
        "(refused when the folder holds anything else); without it, a folder holding a "
        "comparison or one of its runs is refused",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with a killed comparison in --out: keep each run that reached its last "
        "step, train the others again from their first; refused when a run was requested "
        "with other settings",
    )
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

    try:
        base = load_config_file(args.config) if args.config else {}
        train = resolve_config(args, {k: v for k, v in base.items() if k not in _OWN})
        own = {
            name: parse_flag(CompareConfig, name, getattr(args, name), COMPARE_FLAGS[name])
            for name in _NUMBERS
            if getattr(args, name) is not None
        }
        config = CompareConfig(
            train=replace(train, out=args.out),
            modes=tuple(args.modes.split(",")),
            out=args.out,
            leaderboard=not args.no_leaderboard,
            leaderboard_db=args.db,
            **own,
        )
        config = replace(config, train=with_model_folders(config.train))
        check_inputs(config.train)
        dumps_refusing(config.train.to_dict(), what="config")  # each run's config.json
        problem = output_problem(args.out, args.db, leaderboard=not args.no_leaderboard)
        if args.resume and args.overwrite:
            raise ValueError(
                "--resume keeps the runs that finished, --overwrite removes them: choose one"
            )
        problem = problem or out_problem(config, overwrite=args.overwrite, resume=args.resume)
        if problem is not None:
            raise ValueError(problem)
    except (ValueError, TypeError) as exc:
        print(f"compare: error: {exc}", file=sys.stderr)
        return 2
    if args.overwrite:  # every check passed: replace the previous comparison now
        clear_outputs(config)
    for warning in config.train.warnings():  # as train says them; each run's config.json too
        print(f"compare: warning: {warning}", file=sys.stderr, flush=True)
    try:
        results = run_compare(config, resume=args.resume)
    except RuntimeError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    pairs = "".join(line + "\n" for line in verdict_lines(results))  # each pair's verdicts
    if args.json:
        print(json.dumps(results, indent=2))
        print(pairs + verdict(results), file=sys.stderr)
    else:
        _print_table(results)
        print(f"compare: results, plots and runs in {config.out}")
        print(pairs + verdict(results))
    return 0


def _print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    def ci(stat: dict, unit: str = "") -> str:
        if stat["median"] is None:
            return "never"
        lo, hi = (("∞" if v is None else f"{v:.2f}") for v in stat["ci"])
        return f"{stat['median']:.2f}{unit} [{lo}, {hi}]"

    table = Table(
        title=f"time to accuracy {results['target']:g} · accuracy at "
        f"{results['budget_s']:.0f} s · medians [95% CI] over seeds"
    )
    for column in (
        "mode",
        "time to target (s)",
        "acc @ budget",
        "speed-up (per seed)",
        "step (s)",
        "learner idle",
        "T*/T",
    ):
        table.add_column(column)
    for name, m in results["modes"].items():
        eff = m.get("bound_efficiency", {}).get("median")
        idle = m.get("learner_idle_fraction")
        table.add_row(
            name,
            ci(m["time_to_target_s"]),
            ci(m["accuracy_at_budget"]),
            ci(m["speedup_vs_sync"], "x"),
            f"{m.get('step_time_s', 0):.2f}",
            "-" if idle is None else f"{idle:.0%}",
            "-" if eff is None else f"{eff:.2f}",
        )
    Console(width=120).print(table)
