"""What long commands print: progress lines in a pipe, verdict lines that fit, strict JSON."""

from __future__ import annotations

import io
import json
import math
import re
import threading
import time

import pytest

from thundersync import cli_output
from thundersync.cli_output import Progress, fit, plain_table, strict_json


def strict_loads(text: str):
    """json.loads that rejects NaN and Infinity, as strict JSON parsers do."""

    def reject(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=reject)


def test_progress_prints_plain_lines_when_the_stream_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.02)
    stream = io.StringIO()
    with Progress("verify", 24, "checks", stream=stream) as progress:
        progress.advance(5)
        time.sleep(0.2)
    lines = stream.getvalue().splitlines()
    assert lines, "no progress line in a pipe"
    assert lines[-1].startswith("verify: 5/24 checks, ")
    assert lines[-1].endswith(" s")


def test_progress_lines_keep_coming_while_one_unit_takes_long(monkeypatch):
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.02)
    stream = io.StringIO()
    with Progress("eval", 3, "attempts", stream=stream):
        time.sleep(0.2)  # nothing finishes: the user still sees that it runs
    assert stream.getvalue().count("eval: 0/3 attempts") >= 2


def test_progress_stops_printing_once_closed(monkeypatch):
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.02)
    stream = io.StringIO()
    with Progress("x", 1, "runs", stream=stream) as progress:
        progress.advance()
    before = stream.getvalue()
    time.sleep(0.1)
    assert stream.getvalue() == before


class Pipe(io.StringIO):
    """A stream that is not a terminal and sets ``seen`` once ``wanted`` lines were written."""

    def __init__(self, wanted: int):
        super().__init__()
        self.wanted, self.seen = wanted, threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.getvalue().count("\n") >= self.wanted:
            self.seen.set()
        return written


def test_startup_says_it_is_starting_in_a_pipe_until_the_command_starts(monkeypatch):
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.01)
    pipe = Pipe(wanted=2)
    with cli_output.Startup("train", stream=pipe):
        assert pipe.seen.wait(10), pipe.getvalue()  # two lines while imports would run
        with Progress("train", 2, "steps", stream=io.StringIO()):  # the first progress line
            pass
        quiet = pipe.getvalue()
        pipe.wanted, pipe.seen = 10**9, threading.Event()
        assert not pipe.seen.wait(0.1)
    assert pipe.getvalue() == quiet  # nothing once the command said what it does
    assert quiet.splitlines()[0].startswith("train: starting, 0 s (loading libraries")


def test_startup_prints_nothing_on_a_terminal_or_for_a_quick_command(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.01)
    terminal = Terminal()
    with cli_output.Startup("eval", stream=terminal) as startup:
        assert not startup.done.wait(0.1)
    assert terminal.getvalue() == ""
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 60.0)
    pipe = io.StringIO()
    with cli_output.Startup("eval", stream=pipe):
        pass
    assert pipe.getvalue() == "" and cli_output._STARTING == []


def test_fit_cuts_to_80_columns_and_says_so():
    assert fit("a" * 80) == "a" * 80
    cut = fit("b" * 81)
    assert len(cut) == 80 and cut.endswith("...")


def test_plain_table_cuts_long_cells():
    lines = plain_table(["a", "b"], [["x" * 30, "y"]], [10, 3])
    assert lines[1] == "x" * 7 + "..." + "  y"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_strict_json_turns_non_finite_numbers_into_null_with_a_reason(bad):
    text = strict_json({"reward": bad, "ratios": [1.0, bad], "nested": [{"x": bad}], "ok": 1.5})
    data = strict_loads(text)
    assert data["reward"] is None and repr(bad) in data["reward_invalid"]
    assert data["ratios"] == [1.0, None] and data["ratios_invalid"].startswith("[1] ")
    assert data["nested"] == [{"x": None, "x_invalid": f"non-finite value {bad!r}"}]
    assert data["ok"] == 1.5 and "ok_invalid" not in data


def test_without_startup_lines_drops_only_the_startup_notice(monkeypatch):
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.01)
    pipe = Pipe(wanted=1)
    with cli_output.Startup("eval", stream=pipe):
        assert pipe.seen.wait(10)
    text = pipe.getvalue() + "eval: error: --db: x: starting, 5 s is not a schema\n"
    kept = cli_output.without_startup_lines(text)
    assert kept == "eval: error: --db: x: starting, 5 s is not a schema\n", text


def test_a_progress_that_begins_late_keeps_the_interval_since_the_last_line(monkeypatch):
    """A command whose progress begins 4.6 s after its start-up line must not wait another
    full interval (9.6 s of silence was measured): the first periodic line is due
    ``PIPE_INTERVAL_S`` after the last line printed before it, not after it began."""
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 5.0)
    pipe = Pipe(wanted=1)
    with Progress("eval", 4, "attempts", stream=pipe, quiet_since=time.monotonic() - 10):
        assert pipe.seen.wait(4), "no line although the command was quiet for 10 s"
    assert pipe.getvalue().startswith("eval: 0/4 attempts, ")
    with cli_output.Startup("eval", stream=io.StringIO()) as startup:
        assert cli_output.started() == startup.last_line_at
        assert cli_output.started() is None  # once: later progress counts from its own start


def test_each_warmstart_phase_keeps_the_interval_of_the_one_before():
    from thundersync.training.train_command import PhaseProgress

    with PhaseProgress("demonstrations", 4, stream=io.StringIO()) as progress:
        before = progress._bar
        progress("fine-tuning", 0, 2)
        assert progress._bar is not before
        assert progress._bar.quiet_since == before.last_line_at


def test_the_bar_shows_what_runs_as_text_not_markup(monkeypatch):
    """What runs names the user's paths (``--model``): on a terminal, ``a[/b]`` in one must
    not crash the bar (rich's MarkupError) nor ``[reverse]`` restyle it."""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("COLUMNS", "160")  # wide enough for the whole of what runs

    terminal = Terminal()
    what = "loading the model /m/[reverse]x[/reverse]/a[/b]"
    with Progress("train", 2, "steps", stream=terminal) as progress:
        progress.quietly(what)  # the bar alone shows it: no line of its own
        progress.advance()
    assert what in terminal.getvalue()


ROLLING_OUT = "rolling out step 4/12: 8 tasks × 8 episodes, graded in the bwrap sandbox"
"""What ``train`` names while a step rolls out: long enough to push anything after it past
80 columns."""


def test_through_a_pipe_train_keeps_its_step_count_and_eta_within_80_columns(monkeypatch):
    """Each step prints its own line, so the periodic status (printed after a silence) never
    came, and it had no ETA anyway: the count and the ETA come at least every interval while
    steps finish, first on the line, the line within 80 columns."""
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.05)
    pipe = Pipe(wanted=10**9)
    with Progress("train", 12, "steps", stream=pipe) as progress:
        progress.phase(ROLLING_OUT)
        for step in range(1, 7):
            time.sleep(0.03)  # a step, shorter than the interval: its line keeps it busy
            progress.say(f"step {step}/12: reward mean 0.500, solved 50% of 64 episodes " * 2)
            progress.advance()
    status = [line for line in pipe.getvalue().splitlines() if " steps, " in line]
    assert all(len(line) <= 80 for line in status), status
    counted = [line for line in status if not line.startswith("train: 0/12")]
    assert counted, pipe.getvalue()  # the status came although every step printed a line
    for line in counted:
        assert re.match(r"train: [1-6]/12 steps, \d+ s, ETA \d+ s, still rolling out", line), line


def test_on_an_80_column_terminal_the_bar_keeps_its_count_and_eta(monkeypatch):
    """A long description took the whole line: ``...graded in the bwrap sand… E…``."""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setenv("COLUMNS", "80")
    terminal = Terminal()
    with Progress("train", 12, "steps", stream=terminal) as progress:
        progress.quietly(ROLLING_OUT)
        progress.advance(3)
        progress._bar.refresh()
        shown = terminal.getvalue().split("\r")[-1]
    assert "3/12" in shown and "ETA" in shown, shown
