"""``thundersync leaderboard``: print the results table, or write the static HTML page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from leaderboard.render import print_tables, sort_problem, write_html
from leaderboard.store import Store, StoreError, default_path
from thundersync.cli_output import HelpFormatter


def add_leaderboard_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "leaderboard",
        help="show evaluation and comparison results",
        description="Show the leaderboard: every eval and compare result appended to its "
        "SQLite file, as terminal tables (evaluations: agent or checkpoint, rewards, pass@k, "
        "strict grading; comparisons: per mode time to target, accuracy at the budget, "
        "speed-up, steps, target and budget) or a static HTML page with the plots (--html).",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--db",
        default=None,
        help="leaderboard file (default: $THUNDERSYNC_LEADERBOARD or runs/leaderboard.sqlite)",
    )
    parser.add_argument("--suite", default=None, help="only this suite or env id")
    parser.add_argument("--kind", choices=["eval", "compare"], default=None, help="only these")
    parser.add_argument(
        "--sort",
        default=None,
        metavar="KEY",
        help="metric to sort by (evaluations: mean_reward, pass@1, pass@N, "
        "num_tasks; comparisons: accuracy_at_budget, final_accuracy, "
        "speedup_vs_sync, time_to_target_s)",
    )
    parser.add_argument(
        "--html",
        default=None,
        metavar="DIR",
        help="also write a static page (tables and plots) to DIR/index.html",
    )
    parser.set_defaults(func=run_leaderboard_command)


def run_leaderboard_command(args: argparse.Namespace) -> int:

    if args.sort is not None:
        problem = sort_problem(args.sort)
        if problem:
            print(f"leaderboard: error: {problem}", file=sys.stderr)
            return 2
    wanted = Path(args.db) if args.db else default_path()
    if not wanted.exists():  # reading never creates the file
        print(
            f"leaderboard: no results yet: {wanted} does not exist "
            "(eval and compare add a row to it)"
        )
        return 0
    try:
        with Store(args.db, read_only=True) as store:
            entries = store.entries(suite=args.suite, kind=args.kind)
            path = store.path
    except StoreError as exc:
        print(f"leaderboard: error: {exc}", file=sys.stderr)
        return 2
    print_tables(entries, sort=args.sort)  # with --html too: the page is for sharing
    if args.html:
        index = write_html(entries, args.html)
        print(f"leaderboard: {len(entries)} result(s) from {path}; page written to {index}")
        return 0
    print(f"leaderboard: {len(entries)} result(s) from {path}")
    return 0
