"""What long commands print: progress lines in a pipe, verdict lines that fit, strict JSON."""

from __future__ import annotations

import io
import json
import math
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
