"""The shipped tasks' test timeouts leave a loaded 2-core machine room to grade their reference
solutions (issue 35: ``make demo`` printed ``fast-pair-count 0.000`` for the oracle twice in a
row, "the tests ran past their 8 s timeout" though all four tests passed), and fast-pair-count's
naive program still fails its timed tests on a fast machine.

``LOADED_GRADING_S`` is the longest grading of each task's reference solution (one run of its
tests) measured with ``yes > /dev/null`` running on each of the 2 cores (and other jobs sharing
them): ``eval --suite <tb1|harbor> --agent oracle --concurrency 2``, with and without
``--strict``, four times; the grading is the time from the episode's end to its reward (a
fresh sandbox, the upload, the tests), an upper bound of the test script's own time
(environments/fixtures/terminal_bench/README.md has the table). On an idle machine the same
gradings take 1.4-6 s."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from environments.terminal_bench import load_tasks

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"

LOADED_GRADING_S = {
    "fast-pair-count": 18.4,
    "fix-backup-script": 18.0,
    "fix-python-bug": 42.4,
    "git-revert-commit": 19.9,
    "sales-report": 18.8,
    "sort-files": 23.7,
}
MARGIN = 3.0
"""A reference solution's test timeout is at least this many times its loaded grading."""

NAIVE_S_PER_PAIR = 10e-9
"""Less than any CPython takes per iteration of fast-pair-count's naive inner loop (an index,
two subscripts, an add and a compare: 20-100 ns measured here)."""


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_every_shipped_tasks_test_timeout_has_room_for_a_loaded_machine(fmt: str) -> None:
    tasks = load_tasks(FIXTURES / fmt)
    assert sorted(t.task_id for t in tasks) == sorted(LOADED_GRADING_S)
    short = {
        t.task_id: (t.test_timeout_s, LOADED_GRADING_S[t.task_id])
        for t in tasks
        if t.test_timeout_s < MARGIN * LOADED_GRADING_S[t.task_id]
    }
    assert not short, f"timeout under {MARGIN:g}x the loaded grading (timeout, grading): {short}"


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_fast_pair_counts_naive_program_still_fails_its_timed_tests(fmt: str) -> None:
    """Each test stops the program at what a linear-time one needs on the machine now (at most
    a few seconds idle, tens loaded), so the naive O(n²) program (its first run alone) fails
    on any machine, long before the verifier's timeout, which a nop's episode therefore never
    waits out."""
    task = load_tasks(FIXTURES / fmt).get("fast-pair-count")
    folder = FIXTURES / fmt / "fast-pair-count"
    program = next(folder.rglob("count_pairs.py")).read_text()
    count = int(re.search(r"^COUNT = ([\d_]+)$", program, re.MULTILINE)[1])
    naive_s = count * (count - 1) / 2 * NAIVE_S_PER_PAIR
    # past any per-run limit the tests set (40 x a linear pass of ~0.1 s idle: 4 s; 60 s would
    # take a machine fifteen times slower than this loaded one)
    assert naive_s > 60.0 and task.test_timeout_s >= 60.0
    tests = next(folder.rglob("test_outputs.py")).read_text()
    assert "timeout=limit" in tests and "def time_limit" in tests
    for name in ("solution.sh", "solve.sh", "test_outputs.py"):  # one data set everywhere
        for path in folder.rglob(name):
            assert f"{count:_}" in path.read_text(), path
