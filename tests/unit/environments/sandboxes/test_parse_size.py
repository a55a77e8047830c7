"""Sizes a command in a sandbox printed (``protocol.parse_size``): once the agent's code has
run there, ``stat`` and ``wc`` may be its own (a root agent in Docker)."""

from __future__ import annotations

import pytest

from environments.sandboxes.protocol import ExecResult, parse_size
from environments.swebench.transfer import CommandFailed, read_bytes


@pytest.mark.parametrize(
    ("text", "size"),
    [("123\n", 123), ("  0 ", 0), ("9" * 18, 10**18 - 1), ("9" * 19, None), ("1" * 5000, None)]
    + [("\u00b2", None), ("\u0661\u0662", None), ("", None), ("-1", None), ("1e3", None)],
    ids=["plain", "padded", "18-digits", "19-digits", "5000-digits", "superscript"]
    + ["arabic-indic", "empty", "negative", "exponent"],
)
def test_a_size_is_ascii_digits_of_a_bounded_count(text: str, size: int | None) -> None:
    """'²' and Arabic-Indic digits pass ``str.isdigit`` and fail ``int``; 5,000 digits fail
    ``int`` past Python's digit limit: raised, each made grading an infrastructure failure
    (red team, 2026-12-07)."""
    assert parse_size(text) == size


class PlantedStat:
    """A sandbox whose ``stat`` the agent's code replaced: it prints 5,000 ones."""

    workdir = "/testbed"

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        return ExecResult("1" * 5000 + "\n", 0, False, 0.0)


def test_a_read_through_a_planted_stat_is_a_failed_command_not_a_crash() -> None:
    with pytest.raises(CommandFailed, match="cannot stat"):
        read_bytes(PlantedStat(), "/testbed/log", chunk_bytes=1000)
