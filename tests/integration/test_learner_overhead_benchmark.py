"""``benchmarks/learner_overhead.py`` run for real with a tiny budget: progress in a pipe, a
verdict that is the last line and fits, and no median over zero runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from thundersync import cli_output

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learner_overhead.py"
TINY = [
    "--hidden",
    "16",
    "--layers",
    "1",
    "--groups",
    "1",
    "--group-size",
    "2",
    "--turns",
    "1",
    "--tokens",
    "16",
    "--repeats",
    "2",
    "--threads",
    "1",
]


@pytest.fixture(scope="module")
def benchmark():
    spec = importlib.util.spec_from_file_location("learner_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_tiny_run_shows_progress_and_ends_with_its_verdict(benchmark, monkeypatch, capsys):
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.01)
    assert benchmark.main(TINY) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[-1].startswith("learner_overhead: ") and " <= 1.05? " in lines[-1]
    assert all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    progress = [x for x in captured.err.splitlines() if x.startswith("learner_overhead: ")]
    assert progress and all("/11 runs, " in x for x in progress)  # 1 + 3 x 2 + 4 runs


@pytest.mark.parametrize(
    "ratios,outcome",
    [
        ([1.0, 1.04], "met by every pair"),
        ([1.2, 1.1], "NOT met by any pair"),
        ([0.9, 1.3, 1.0], "undecided"),
    ],
)
def test_the_verdict_says_when_the_pairs_straddle_the_target(benchmark, ratios, outcome):
    assert benchmark.verdict(ratios).endswith(f"? {outcome}")


def test_zero_repeats_is_refused(benchmark, capsys):
    with pytest.raises(SystemExit) as exit_info:
        benchmark.main([*TINY, "--repeats", "0"])
    assert exit_info.value.code == 2
    assert "--repeats must be >= 1, got 0" in capsys.readouterr().err
