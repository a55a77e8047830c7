"""The comparison's report: every ratio it prints agrees with the numbers printed beside it,
and every fraction in ``results.json`` lies between 0 and 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.compare import CompareConfig, Run
from harness.compare_report import summarize, verdict
from harness.curves import Point
from thundersync.training.config import TrainConfig

STEP = {
    "submitted_at": 0.0,
    "finished_at": 2.0,
    "step_time_s": 2.0,
    "num_episodes": 4,
    "learner": {},
    # tools and grading are summed over the 4 concurrent episodes: more than the step's 2 s
    "breakdown_s": {"engine": 1.5, "tool": 6.0, "grading": 9.0, "step": 0.5},
}


def _run(tmp_path: Path, mode: str, seed: int, reached_at: float | None) -> Run:
    folder = tmp_path / f"{mode}-seed{seed}"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, **STEP}) + "\n")
    for name in ("events.jsonl", "spans.jsonl"):
        (folder / name).write_text("")
    curve = [Point(0, 0.0, 0.1), Point(2, 100.0, 0.2)]
    if reached_at is not None:
        curve.insert(1, Point(1, reached_at, 0.7))
    return Run(mode, seed, folder, curve)


def _results(tmp_path: Path, times: dict[str, list[float | None]]) -> dict:
    runs = [
        _run(tmp_path, mode, seed, t)
        for mode, per_seed in times.items()
        for seed, t in enumerate(per_seed)
    ]
    config = CompareConfig(
        train=TrainConfig(model=str(tmp_path)),
        modes=tuple(times),
        seeds=len(next(iter(times.values()))),
        target=0.6,
        out=str(tmp_path / "out"),
        leaderboard=False,
    )
    return summarize(runs, config, 0.1)


def test_the_verdict_never_prints_a_ratio_that_disagrees_with_the_times_beside_it(tmp_path):
    """Issue 35's case: per seed, the mode beats sync on two seeds of three, so the median of
    the per-seed ratios is above 1 while the mode's median time is the longer. Printed side by
    side as ``sync 35 s, async-k1 48 s (1.20x)`` that reads as a contradiction: a ratio shown
    beside two times must be theirs, and a per-seed one must say that it is."""
    results = _results(tmp_path, {"sync": [35.0, 20.0, 60.0], "async-k1": [48.0, 16.0, 50.0]})
    lines = verdict(results).splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    times_line = next(line for line in lines if "time to 0.6" in line)
    assert re.fullmatch(
        r"compare: median time to 0\.6 \(3 seeds\): sync 35 s, async-k1 48 s", times_line
    ), times_line
    assert "x" not in times_line.split(":", 2)[2]  # no ratio beside the medians
    speed_line = next(line for line in lines if "speed-up" in line)
    assert speed_line == "compare: median per-seed speed-up vs sync: async-k1 1.20x", speed_line
    assert results["modes"]["async-k1"]["speedup_vs_sync"]["median"] == 1.2


def test_a_mode_that_never_reached_the_target_or_beat_a_sync_that_never_did(tmp_path):
    results = _results(tmp_path, {"sync": [None], "async-k1": [None], "async-k2": [30.0]})
    lines = verdict(results).splitlines()
    assert lines[0] == "compare: time to 0.6 (1 seed): sync never, async-k1 never, async-k2 30 s"
    assert lines[1] == "compare: speed-up vs sync: async-k1 never, async-k2 ∞ (sync never)"


def test_breakdown_fractions_are_fractions_and_concurrent_work_is_per_episode(tmp_path):
    """Tools and grading run in many episodes at once: their seconds summed over episodes
    (7.5 s in a 2 s step here) are no fraction of the step; they are reported per episode."""
    mode = _results(tmp_path, {"sync": [10.0]})["modes"]["sync"]
    fractions = mode["breakdown_fraction"]
    assert all(0.0 <= value <= 1.0 for value in fractions.values()), fractions
    assert "tool" not in fractions and "grading" not in fractions
    assert fractions["engine"] == 0.75 and fractions["step"] == 0.25
    assert mode["tool_s_per_episode"] == 1.5 and mode["grading_s_per_episode"] == 2.25


def test_results_carry_each_pairs_verdicts_beside_the_keys_outside_tools_read(tmp_path):
    """``verdicts`` is added, nothing is renamed; its time-to-target speed-ups are the
    report's own per-seed speed-ups over sync (one statistic), and it is strict JSON."""
    results = _results(tmp_path, {"sync": [35.0, 20.0, 60.0], "async-k1": [48.0, 16.0, 50.0]})
    old = {"config", "target", "budget_s", "initial_accuracy", "modes", "runs"}
    assert old < set(results) and "verdicts" in results
    pair = results["verdicts"]["pairs"]["async-k1 vs sync"]
    speedup = results["modes"]["async-k1"]["speedup_vs_sync"]
    for key in ("median", "ci", "per_seed"):
        assert pair["time_to_target"][key] == speedup[key]
    assert pair["time_to_target"]["verdict"] == "not distinguishable"  # 2 of 3 seeds, 3 seeds
    json.dumps(results, allow_nan=False)
