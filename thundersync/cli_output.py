"""What long commands print: progress that works in a pipe, a one-line verdict, strict JSON.

The conventions of docs/design.md §8: progress goes to stderr (a live bar on a terminal; in a
pipe or a log file, where a live bar prints nothing, one plain line every few seconds); the
verdict is the last line, plain and at most 80 columns, so ``| tail -1`` and a CI log both
show it whole; ``--json`` and results files are strict JSON (no NaN or Infinity, which most
JSON parsers other than Python's reject).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import threading
import time
from typing import IO, Any

PIPE_INTERVAL_S = 5.0
"""Seconds between two progress lines when stderr is not a terminal."""
WIDTH = 80
"""Columns a verdict line and a plain table fit in."""


class Progress:
    """Counts the finished units of a long command (``with Progress(...) as p: p.advance()``)
    and says what it is doing.

    On a terminal it shows a transient rich bar with ETA, and the lines of ``say``/``phase``
    above it. Elsewhere those lines are printed plain, and a daemon thread prints
    ``<label>: <done>/<total> <unit>, <seconds> s[, still <what>]`` whenever nothing was
    printed for ``PIPE_INTERVAL_S`` seconds, also while a single unit takes long (that line
    is how a user tells slow from stuck). Every method may be called from any thread.
    """

    def __init__(
        self,
        label: str,
        total: int,
        unit: str,
        *,
        stream: IO[str] | None = None,
        quiet_since: float | None = None,
    ):
        self.label, self.total, self.unit = label, total, unit
        self.quiet_since = quiet_since
        """``time.monotonic()`` of the command's last line before this progress began (the
        first periodic line comes ``PIPE_INTERVAL_S`` after it; None: after ``__enter__``)."""
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.what = ""
        """What runs now (``phase``/``quietly``), for the periodic line and the bar."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = self._last_line = time.monotonic()
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._bar_task: Any = None

    def __enter__(self) -> Progress:
        before = started()
        self._started = self._last_line = time.monotonic()
        for since in (before, self.quiet_since):
            if since is not None:
                self._last_line = min(self._last_line, since)
        if _is_terminal(self.stream):
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                # what runs names the user's paths: text, so ``a[/b]`` in one is not markup
                TextColumn(f"{self.label} {{task.description}}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.__enter__()
            self._bar_task = self._bar.add_task(self.unit, total=self.total, completed=self.done)
        else:
            self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
        if self._bar is not None:
            self._bar.advance(self._bar_task, n)

    def skip_to(self, done: int) -> None:
        """Units finished before this process started (a resumed run)."""
        with self._lock:
            self.done = done
        if self._bar is not None:
            self._bar.update(self._bar_task, completed=done)

    def say(self, text: str) -> None:
        """Print ``<label>: <text>`` (above the bar on a terminal)."""
        line = f"{self.label}: {text}"
        with self._lock:
            self._last_line = time.monotonic()
            if self._bar is not None:
                self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                print(line, file=self.stream, flush=True)

    def phase(self, what: str) -> None:
        """Say that ``what`` starts now; the periodic line names it until the next phase."""
        self.quietly(what)
        self.say(what)

    def quietly(self, what: str) -> None:
        """Name what runs now for the periodic line and the bar, without a line of its own."""
        with self._lock:
            self.what = what
        if self._bar is not None:
            self._bar.update(self._bar_task, description=what)

    @property
    def last_line_at(self) -> float:
        """``time.monotonic()`` of this progress's last line (or of its start)."""
        with self._lock:
            return self._last_line

    def line(self) -> str:
        return f"{self.label}: {self._status()}"

    def _status(self) -> str:
        with self._lock:
            done, what = self.done, self.what
        elapsed = time.monotonic() - self._started
        still = f", still {what}" if what else ""
        return f"{done}/{self.total} {self.unit}, {elapsed:.0f} s{still}"

    def _tick(self) -> None:
        while not self._stop.wait(PIPE_INTERVAL_S / 5):
            with self._lock:
                silent = time.monotonic() - self._last_line >= PIPE_INTERVAL_S
            if silent:
                self.say(self._status())


class Startup:
    """A command's start-up through a pipe: until the command's first progress line
    (``Progress`` or ``started()``), a line ``<label>: starting, <seconds> s (...)`` every
    ``PIPE_INTERVAL_S`` seconds. Importing torch and the envs and checking the inputs take
    2-3 s on an idle 2-core machine, but tens of seconds on a loaded one, and a pipe would
    show nothing all that time. A command done sooner prints nothing more; on a terminal
    nothing is printed at all. (``with Startup("train"): ...``)"""

    def __init__(self, label: str, *, stream: IO[str] | None = None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Startup:
        self._started = self.last_line_at = time.monotonic()
        _STARTING.append(self)
        if not _is_terminal(self.stream):
            self._thread = threading.Thread(target=self._tick, name="startup", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self._thread is not None:
            self._thread.join()
        _STARTING.remove(self)

    def _tick(self) -> None:
        while not self.done.wait(PIPE_INTERVAL_S):
            elapsed = time.monotonic() - self._started
            print(
                f"{self.label}: starting, {elapsed:.0f} s (loading libraries, checking inputs)",
                file=self.stream,
                flush=True,
            )
            self.last_line_at = time.monotonic()


def without_startup_lines(text: str) -> str:
    """``text`` (a command's stderr) without the lines ``Startup`` printed, which come and go
    with the machine's load: what a check of the command's own messages compares."""
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not STARTUP_LINE.fullmatch(line.rstrip("\n"))
    )


STARTUP_LINE = re.compile(r"\S+: starting, \d+ s \(loading libraries, checking inputs\)")
"""What ``Startup`` prints."""

_STARTING: list[Startup] = []
"""The ``Startup`` notices running (one per ``main`` call: normally none or one)."""


def started() -> float | None:
    """The command has said what it is doing: the start-up lines stop. Returns when the
    start-up began or last printed (None when none was running), so that the command's
    next periodic line keeps the interval."""
    running = [startup for startup in _STARTING if not startup.done.is_set()]
    for startup in running:
        startup.done.set()
    return min((s.last_line_at for s in running), default=None)


def _is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


# --- verdict and tables -----------------------------------------------------------------------


def fit(text: str, width: int = WIDTH) -> str:
    """``text`` cut to ``width`` columns, ending in ``...`` when it was cut."""
    return text if len(text) <= width else text[: width - 3] + "..."


def print_verdict(line: str, *, to_stderr: bool = False) -> None:
    """Print the verdict as the last line: after everything on stdout has been flushed.

    With ``--json`` stdout holds only the JSON document, so the verdict goes to stderr.
    """
    sys.stdout.flush()
    stream = sys.stderr if to_stderr else sys.stdout
    print(fit(line), file=stream, flush=True)


def plain_table(header: list[str], rows: list[list[str]], widths: list[int]) -> list[str]:
    """Left-aligned columns, two spaces apart; a cell longer than its width is cut."""
    lines = []
    for row in [header, *rows]:
        cells = [fit(cell, width).ljust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines


# --- strict JSON ------------------------------------------------------------------------------


def strict_json(obj: Any, *, indent: int | None = 2) -> str:
    """``obj`` as strict JSON: every non-finite float becomes null, and the dict that held it
    gains ``<key>_invalid`` saying what the value was (for a list, which positions)."""
    return json.dumps(_finite(obj)[0], indent=indent, allow_nan=False)


def _finite(value: Any) -> tuple[Any, str | None]:
    """(value with non-finite floats replaced by None, what was replaced or None)."""
    if isinstance(value, float):
        return (value, None) if math.isfinite(value) else (None, f"non-finite value {value!r}")
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            out[key], problem = _finite(item)
            if problem is not None:
                out[f"{key}_invalid"] = problem
        return out, None
    if isinstance(value, list | tuple):
        items, problems = [], []
        for i, item in enumerate(value):
            clean, problem = _finite(item)
            items.append(clean)
            if problem is not None:
                problems.append(f"[{i}] {problem}")
        return items, ("; ".join(problems) or None)
    return value, None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where its help already says what happens without
    it (an option with no default value, or a required one)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)
