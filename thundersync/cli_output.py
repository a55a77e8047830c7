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
"""Columns a verdict line, a plain table and a progress status fit in."""
BAR_WIDTH = 16
"""Columns of the terminal bar itself (rich's default 40 left a long description none)."""


class Progress:
    """Counts the finished units of a long command (``with Progress(...) as p: p.advance()``)
    and says what it is doing.

    On a terminal it shows a transient rich bar with ETA, and the lines of ``say``/``phase``
    above it; what runs is cut to the width left, never the count and the ETA. Elsewhere
    those lines are printed plain, and a daemon thread prints the status,
    ``<label>: <done>/<total> <unit>, <seconds> s, ETA <time>[, still <what>]`` (``no ETA
    yet`` before the first unit is done) in at most 80 columns (``what`` cut first):
    whenever nothing was printed for ``PIPE_INTERVAL_S`` seconds, also while a single unit
    takes long (that line is how a user tells slow from stuck), and every
    ``PIPE_INTERVAL_S`` while units finish, though other lines come (a command that prints a
    line per unit would otherwise never show its count and ETA). Every method may be called
    from any thread.
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
        self._started = self._last_line = self._last_status = time.monotonic()
        self._status_done = 0
        """``done`` when the status was last printed."""
        self._advanced: list[tuple[float, int]] = []
        """(time, done) at this process's start and at its first and latest advance: the rate
        the ETA is computed from."""
        self._thread: threading.Thread | None = None
        self._bar: Any = None
        self._bar_task: Any = None

    def __enter__(self) -> Progress:
        before = started()
        self._started = self._last_line = self._last_status = time.monotonic()
        with self._lock:
            self._advanced = [(self._started, self.done)]
            self._status_done = self.done
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
            from rich.table import Column

            self._bar = RichProgress(
                # what runs names the user's paths: text, so ``a[/b]`` in one is not markup;
                # it takes the width the others leave, cut with "…" (the count and ETA stay)
                TextColumn(
                    f"{self.label} {{task.description}}",
                    markup=False,
                    table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
                ),
                BarColumn(bar_width=BAR_WIDTH),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=True,
                expand=True,
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
            latest = (time.monotonic(), self.done)
            if len(self._advanced) < 3:
                self._advanced.append(latest)
            else:
                self._advanced[2] = latest
        if self._bar is not None:
            self._bar.advance(self._bar_task, n)

    def skip_to(self, done: int) -> None:
        """Units finished before this process started (a resumed run)."""
        with self._lock:
            self.done = self._status_done = done
            self._advanced = [(self._advanced[0][0] if self._advanced else time.monotonic(), done)]
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
        """The status, in ``WIDTH`` columns with the label: what runs is cut, never the count
        or the ETA before it."""
        now = time.monotonic()
        with self._lock:
            done, what, advanced = self.done, self.what, list(self._advanced)
            self._last_status, self._status_done = now, done
        eta = _eta(advanced, self.total, now)
        head = f"{done}/{self.total} {self.unit}, {now - self._started:.0f} s, {eta}"
        room = WIDTH - len(self.label) - 2 - len(head)
        still = fit(f", still {what}", room) if what and room > len(", still ...") else ""
        return head + still

    def _tick(self) -> None:
        while not self._stop.wait(PIPE_INTERVAL_S / 5):
            now = time.monotonic()
            with self._lock:
                silent = now - self._last_line >= PIPE_INTERVAL_S
                moved = self.done != self._status_done
                due = moved and now - self._last_status >= PIPE_INTERVAL_S
            if silent or due:
                self.say(self._status())


def _eta(advanced: list[tuple[float, int]], total: int, now: float) -> str:
    """``ETA <time>`` from the rate units finished at: between the first and the latest
    advance (the first unit also carries the start-up, so it is the rate only until a second
    one is in), counting down from the latest; never below what the other units left need,
    while one takes longer than the rate."""
    if len(advanced) < 2:
        return "no ETA yet"
    (t0, d0), (t1, d1) = (advanced[0], advanced[-1]) if len(advanced) == 2 else advanced[1:3]
    if d1 <= d0:
        return "no ETA yet"
    per_unit, left = (t1 - t0) / (d1 - d0), max(total - d1, 0)
    seconds = max(left * per_unit - (now - t1), (left - 1) * per_unit, 0.0)
    return f"ETA {duration(seconds)}"


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


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
