"""The README's results block, generated from a comparison's ``results.json`` (issue 38 item 2).

``python -m harness.results_table demo-out/compare/results.json --into README.md`` (``make
readme-results``) rewrites what lies between the README's ``--8<-- [start:results]`` and
``[end:results]`` markers: one line saying what ran (the command's settings, read from the
results, with the date and commit), the per-mode table, and a sentence per pair of modes that
says what its paired CIs say (``harness.verdicts``) and nothing else. No narrative is written
by hand, so a rerun cannot contradict one: the block is regenerated from the rerun.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from harness.verdicts import FASTER, SLOWER, replication, replication_lines
from thundersync.protocol.documents import DocumentError, load_json

START = "<!-- --8<-- [start:results] -->"
END = "<!-- --8<-- [end:results] -->"
WIDTH = 100


def render(results: dict[str, Any], *, date: str, commit: str) -> str:
    """The block's markdown (without the markers)."""
    config, train = results["config"], results["config"]["train"]
    modes = results["modes"]
    seeds = max(len(m["seeds"]) for m in modes.values())
    target, budget = results["target"], results["budget_s"]
    lines = [
        f"`make demo` on a {os.cpu_count()}-core CPU machine ({date}, main at {commit}): "
        f"{train['env']}, GRPO, {train['tasks_per_step']} tasks × {train['group_size']} "
        f"samples per step, {train['steps']} steps, {seeds} seeds, {config['eval_tasks']} "
        f"held-out tasks per evaluation every {config['eval_every']} steps (held-out accuracy "
        f"{results['initial_accuracy']:.2f} before the first step); medians over seeds with "
        "distribution-free 95 % CIs (the sign test's):",
        "",
        f"| mode | time to {target:g} accuracy | speed-up vs {_baseline(results)} (paired) "
        f"| step time | accuracy at {budget:.0f} s | stale tokens |",
        "|---|---|---|---|---|---|",
    ]
    for name, stats in modes.items():
        lines.append(
            f"| {name} | {_seconds(stats['time_to_target_s'])} "
            f"| {_times(stats['speedup_vs_sync'])} | {_step(stats)} "
            f"| {_accuracy(stats['accuracy_at_budget'])} | {_stale(stats)} |"
        )
    lines.append("")
    pairs = (results.get("verdicts") or {}).get("pairs", {})
    lines += [f"- {sentence(name, pair, target, budget)}" for name, pair in pairs.items()]
    return "".join(_wrapped(line) + "\n" for line in lines)


def _wrapped(line: str) -> str:
    """A prose line wrapped at the page's 100 columns (a bullet's lines indented under it)."""
    if line.startswith("|") or len(line) <= WIDTH:
        return line
    indent = "  " if line.startswith("- ") else ""
    return "\n".join(textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False))


def sentence(name: str, pair: dict[str, Any], target: float, budget: float) -> str:
    """One pair's verdicts as a sentence: each metric's verdict with its paired figure."""
    parts = [
        f"time to {target:g}: {_verdict(pair['time_to_target'])}",
        f"accuracy at {budget:.0f} s: {_verdict(pair['accuracy_at_budget'])}",
        f"area under the curve to {budget:.0f} s: {_verdict(pair['area_under_curve'])}",
    ]
    steps = pair.get("equal_steps")
    if steps:
        same = (
            "the same held-out accuracy at every evaluated step"
            if steps["accuracy_equal_at_every_step"]
            else "**different accuracy at some step: not the same updates**"
        )
        parts.append(f"at equal steps ({steps['steps']}): {_verdict(steps)}, with {same}")
    n = len(pair["seeds"])
    return f"**{name}** ({n} seed{'s' * (n != 1)}): " + "; ".join(parts) + "."


def _verdict(stat: dict[str, Any]) -> str:
    word = stat["verdict"]
    if stat["statistic"] == "speedup":
        figure = f"{_number(stat['median'], 'x')} [{_number(stat['ci'][0], '')}, "
        figure += f"{_number(stat['ci'][1], '')}]"
    else:
        figure = f"{_signed(stat['median'])} [{_signed(stat['ci'][0])}, {_signed(stat['ci'][1])}]"
    if word in (FASTER, SLOWER):
        return f"{word}, {figure}"
    extra = f"; {stat['seeds_to_separate_text']}" if stat.get("seeds_to_separate_text") else ""
    return f"not distinguishable, {figure}{extra}"


def _baseline(results: dict[str, Any]) -> str:
    return next(iter(results["modes"]))


def _number(value: float | None, unit: str) -> str:
    return "∞" if value is None else f"{value:.2f}{unit}"


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def _seconds(stat: dict[str, Any]) -> str:
    lo, hi = (("∞" if v is None else f"{v:.1f}") for v in stat["ci"])
    median = "never" if stat["median"] is None else f"{stat['median']:.1f} s"
    return f"{median} [{lo}, {hi}]"


def _times(stat: dict[str, Any]) -> str:
    return f"{_number(stat['median'], '×')} [{_number(stat['ci'][0], '')}, " + (
        f"{_number(stat['ci'][1], '')}]"
    )


def _accuracy(stat: dict[str, Any]) -> str:
    return f"{stat['median']:.2f} [{stat['ci'][0]:.2f}, {stat['ci'][1]:.2f}]"


def _step(stats: dict[str, Any]) -> str:
    return f"{stats['step_time_s']:.1f} s" if stats.get("step_time_s") is not None else "–"


def _stale(stats: dict[str, Any]) -> str:
    histogram = (stats.get("staleness") or {}).get("histogram") or {}
    tokens = sum(histogram.values())
    old = sum(v for k, v in histogram.items() if int(k) > 0)
    if not tokens or not old:
        return "0"
    most = stats["staleness"]["max"]
    return f"{old / tokens:.0%}, up to {most} version{'s' * (most != 1)} old"


def splice(text: str, block: str, *, path: Path) -> str:
    """``text`` with what lies between the markers replaced by ``block``."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"{path}: needs one {START!r} line before one {END!r} line")
    head, rest = text.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{block}{END}{tail}"


def _commit() -> str:
    found = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return found.stdout.strip() or "an unknown commit"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.results_table", description=__doc__)
    parser.add_argument("results", type=Path, help="a comparison's results.json")
    parser.add_argument("--into", type=Path, help="rewrite this file's results block (README.md)")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--commit", default=None, help="default: the checkout's HEAD")
    parser.add_argument(
        "--replicates",
        type=Path,
        metavar="OTHER",
        help="print each verdict beside another run's results.json, and how many agree "
        "(exit status 1 when one differs)",
    )
    args = parser.parse_args(argv)
    try:
        results = _read(args.results)
        other = None if args.replicates is None else _read(args.replicates)
    except (OSError, DocumentError) as err:
        print(f"results_table: error: {err}", file=sys.stderr)
        return 2
    if other is not None:
        rows = replication(results, other)
        print("\n".join(replication_lines(rows)))
        return 0 if all(row["same"] for row in rows) else 1
    block = render(results, date=args.date, commit=args.commit or _commit())
    if args.into is None:
        print(block, end="")
        return 0
    args.into.write_text(splice(args.into.read_text(), block, path=args.into))
    print(f"results_table: {args.into}'s results block rewritten from {args.results}")
    return 0


def _read(path: Path) -> dict[str, Any]:
    """A comparison's results.json; a DocumentError naming the file when it is not one."""
    results = load_json(path.read_text(), path)
    if not isinstance(results, dict) or "verdicts" not in results or "modes" not in results:
        raise DocumentError(path, "not a comparison's results.json (no modes or verdicts)")
    return results


if __name__ == "__main__":
    raise SystemExit(main())
