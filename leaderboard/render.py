"""The leaderboard as a terminal table and as a static HTML page (tables and plots)."""

from __future__ import annotations

import html
import math
import re
import shutil
from pathlib import Path
from typing import Any

from leaderboard.store import Entry

EVAL_COLUMNS = (
    "#",
    "suite",
    "agent / checkpoint",
    "sandbox / engine",
    "mean reward",
    "pass@1",
    "pass@k",
    "tasks",
    "infra",
    "strict",
    "date",
)
COMPARE_COLUMNS = (
    "#",
    "env",
    "mode",
    "sandbox / engine",
    "time to target (s)",
    "acc @ budget",
    "speed-up vs sync (per seed)",
    "seeds",
    "steps",
    "target",
    "budget (s)",
    "date",
)
EVAL_SORT_KEYS = ("mean_reward", "pass@1", "pass@N", "num_tasks")
"""What ``--sort`` takes for evaluations (pass@N for any N; the highest first)."""
COMPARE_SORT_KEYS = ("accuracy_at_budget", "final_accuracy", "speedup_vs_sync", "time_to_target_s")
"""What ``--sort`` takes for comparisons (medians; time to target the lowest first)."""
_LOWER_IS_BETTER = {"time_to_target_s"}
WIDTH = 140
"""Columns the terminal tables take, when they fit (a wider table gets what it needs)."""
UNBOUNDED = 10_000
"""A console width no table reaches, to measure a table's natural width."""


def sort_problem(sort: str) -> str | None:
    """Why ``sort`` is not a key the tables sort by (with the valid keys), or None."""
    if sort in EVAL_SORT_KEYS or sort in COMPARE_SORT_KEYS or re.fullmatch(r"pass@[1-9]\d*", sort):
        return None
    return (
        f"--sort {sort!r}: expected an evaluation key ({', '.join(EVAL_SORT_KEYS)}) or a "
        f"comparison key ({', '.join(COMPARE_SORT_KEYS)})"
    )


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ci(stat: dict[str, Any] | None, digits: int = 2) -> str:
    if not stat or stat.get("median") is None:
        return "never" if stat else "-"
    lo, hi = ("inf" if v is None else f"{v:.{digits}f}" for v in stat["ci"])
    return f"{stat['median']:.{digits}f} [{lo}, {hi}]"


def subject_label(entry: Entry) -> str:
    """The agent, or the checkpoint as its run folder and step (``streaming/step-000020``)
    rather than the step alone, which every run has."""
    if not entry.checkpoint:
        return entry.subject
    path = Path(entry.checkpoint)
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        return f"{path.parent.parent.name}/{path.name}"
    return path.name or entry.subject


def runs_on(config: dict[str, Any], *, policy: bool = True) -> str:
    """Where a result's episodes ran: the sandbox and, for a model's agent, the engine (and
    the device when not the CPU). Two rows that differ only here are not the same result."""
    sandbox = str(config.get("sandbox") or "-")
    if not policy:
        return sandbox
    engine = str(config.get("engine") or "-")
    device = config.get("device")
    return f"{sandbox} / {engine}" + (f" ({device})" if device and device != "cpu" else "")


def _yes_no(value: Any) -> str:
    return "-" if value is None else ("yes" if value else "no")


def eval_rows(entries: list[Entry], sort: str = "mean_reward") -> list[list[str]]:
    chosen = [e for e in entries if e.kind == "eval"]

    def by_metric(e: Entry) -> float:
        value = e.metrics.get(sort)
        return -(value if value is not None else -1)

    chosen.sort(key=by_metric)
    rows = []
    for e in chosen:
        m = e.metrics
        k = m.get("k", 1)
        rows.append(
            [
                str(e.id),
                e.suite,
                subject_label(e),
                runs_on(e.config, policy=e.config.get("agent", "policy") == "policy"),
                _num(m.get("mean_reward")),
                _num(m.get("pass@1")),
                f"{_num(m.get(f'pass@{k}'))} (k={k})",
                str(m.get("num_tasks", "-")),
                str(m.get("num_infra_failed_attempts", 0)),
                _yes_no(m.get("strict")),
                e.created_at[:10],
            ]
        )
    return rows


def compare_rows(entries: list[Entry], sort: str | None = None) -> list[list[str]]:
    """A row per mode of each comparison. Without ``sort``, each comparison's modes together
    (the most accurate at the budget first); with it, every row ranked by it, whichever
    comparison it is from, a mode that never reached the target last."""
    rows = [(e, name, m) for e in entries if e.kind == "compare" for name, m in _modes(e)]
    if sort is None:
        rows.sort(key=lambda row: (row[0].id or 0, _rank(row[2], "accuracy_at_budget")))
    else:
        rows.sort(key=lambda row: _rank(row[2], sort))
    out = []
    for e, name, m in rows:
        train = e.config.get("train") or {}
        target, budget = e.metrics.get("target"), e.metrics.get("budget_s")
        out.append(
            [
                str(e.id),
                e.suite,
                name,
                runs_on(train),
                _ci(m.get("time_to_target_s"), 1),
                _ci(m.get("accuracy_at_budget")),
                _speedup(m),
                str(len(m.get("time_to_target_s", {}).get("per_seed", []))),
                str(train.get("steps", "-")),
                _num(target, 2),
                _num(budget, 1),
                e.created_at[:10],
            ]
        )
    return out


def _modes(entry: Entry) -> list[tuple[str, dict[str, Any]]]:
    return list((entry.metrics.get("modes") or {}).items())


def _rank(mode: dict[str, Any], sort: str) -> tuple[bool, float]:
    """Sort key: the best first, no value (never reached) last. A speed-up of None over a
    sync that never reached the target is ∞ when the mode did: the best."""
    median = (mode.get(sort) or {}).get("median")
    if median is None and sort == "speedup_vs_sync" and _reached(mode):
        median = math.inf
    if median is None:
        return True, 0.0
    return False, median if sort in _LOWER_IS_BETTER else -median


def _reached(mode: dict[str, Any]) -> bool:
    return (mode.get("time_to_target_s") or {}).get("median") is not None


def _speedup(mode: dict[str, Any]) -> str:
    """The median per-seed speed-up with its CI: "never" when this mode never reached the
    target, ∞ when it did and sync never did."""
    stat = mode.get("speedup_vs_sync")
    if stat and stat.get("median") is None and _reached(mode):
        return "∞ (sync never)"
    if stat and not _reached(mode) and "time_to_target_s" in mode:
        return "never"
    return _ci(stat)


def print_tables(entries: list[Entry], *, sort: str | None = None) -> None:
    """Both tables on the terminal. Every cell is ``Text``, never markup: suites, agents and
    checkpoint paths are the user's, and a row stays in the append-only store, so a name
    such as ``a[/b]`` must not crash every later ``leaderboard`` nor ``[reverse]`` restyle it."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    for title, columns, rows in (
        ("evaluations", EVAL_COLUMNS, eval_rows(entries, sort or "mean_reward")),
        ("comparisons", COMPARE_COLUMNS, compare_rows(entries, sort)),
    ):
        if not rows:
            continue
        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*map(Text, row))
        # as wide as the table needs (140 columns when that suffices): a narrower console
        # cuts names to "…" first, and a leaderboard row is read by its env and its mode
        needed = Console(width=UNBOUNDED).measure(table).maximum
        Console(width=max(WIDTH, needed)).print(table)


def write_html(entries: list[Entry], folder: str | Path, *, title: str = "ThunderSync") -> Path:
    """``folder/index.html`` with both tables and every comparison's plots (copied next to it,
    so the folder can be served or archived on its own)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    sections = [f"<h1>{html.escape(title)} leaderboard</h1>"]
    tables = (
        ("Evaluations", EVAL_COLUMNS, eval_rows(entries)),
        ("Comparisons", COMPARE_COLUMNS, compare_rows(entries)),
    )
    for name, columns, rows in tables:
        sections.append(f"<h2>{name}</h2>" + _table(columns, rows, name.lower()))
    for e in entries:
        plots = [Path(p) for p in e.artifacts.get("plots", []) if Path(p).is_file()]
        if not plots:
            continue
        images = []
        for plot in plots:
            target = out / "plots" / str(e.id) / plot.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(plot, target)
            alt = html.escape(f"{e.suite} comparison {e.id}: {plot.stem.replace('_', ' ')}")
            images.append(f'<img src="plots/{e.id}/{html.escape(plot.name)}" alt="{alt}">')
        sections.append(
            f"<h2>Comparison #{e.id}: {html.escape(e.suite)}</h2>"
            f'<div class="plots">{"".join(images)}</div>'
        )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)} leaderboard</title><style>{_CSS}</style></head>"
        f"<body>{''.join(sections)}</body></html>\n"
    )
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def _table(columns: tuple[str, ...], rows: list[list[str]], name: str) -> str:
    if not rows:
        return f'<p class="empty">No {name} yet.</p>'
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f'<table id="{name}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: left; }
th { background: #f3f3f3; }
.plots img { max-width: 48%; margin: 0.5em 1% 0.5em 0; border: 1px solid #ddd; }
"""
