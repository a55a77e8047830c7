"""compare's verdicts on synthetic curves whose answer is known: a clearly faster mode is
``faster`` on every metric (and at equal steps, for the exact modes), a clearly slower one
``slower``, and two modes drawn from one distribution ``not distinguishable``, with the
seeds that would separate them; no training run."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.curves import Point, area_under_curve
from harness.verdicts import (
    MIN_SEEDS,
    UNDECIDED,
    pair_verdicts,
    paired,
    seeds_to_separate,
    verdict_lines,
)
from thundersync.training.modes import mode_from_label

TARGET, BUDGET = 0.6, 12.0
ACCURACY = [0.25, 0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.72]
"""Held-out accuracy after each step (step 0 first): the exact modes' shared curve."""


def _run(tmp_path: Path, mode: str, seed: int, step_s: list[float], accuracy: list[float]):
    """A run whose steps took ``step_s`` (its metrics.jsonl) and scored ``accuracy`` (its
    curve, a checkpoint evaluated after every step)."""
    folder = tmp_path / f"{mode}-seed{seed}"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": i + 1, "step_base": 1, "step_time_s": s}) + "\n"
            for i, s in enumerate(step_s)
        )
    )
    clock, curve = 0.0, [Point(0, 0.0, accuracy[0])]
    for i, s in enumerate(step_s):
        clock += s
        curve.append(Point(i + 1, clock, accuracy[i + 1]))
    return SimpleNamespace(mode=mode, seed=seed, folder=folder, curve=curve)


def _comparison(tmp_path: Path, speed: dict[str, float], seeds: int = 6, jitter: float = 0.02):
    """Every mode on ``seeds`` seeds, each step ``speed[mode]`` times sync's seconds; a seed's
    machine is 0.8-1.25x as fast for every mode (the drift pairing cancels), each step
    ``jitter`` more. Non-exact modes' accuracy wobbles by 0.02 per step."""
    rng = random.Random(7)
    runs = []
    for seed in range(seeds):
        machine = rng.uniform(0.8, 1.25)
        for mode, factor in speed.items():
            step_s = [
                2.0 * factor * machine * rng.uniform(1 - jitter, 1 + jitter) for _ in ACCURACY[1:]
            ]
            accuracy = (
                ACCURACY
                if mode_from_label(mode, staleness=1).exact
                else [a + rng.uniform(-0.02, 0.02) for a in ACCURACY]
            )
            runs.append(_run(tmp_path, mode, seed, step_s, accuracy))
    return {
        "target": TARGET,
        "budget_s": BUDGET,
        "verdicts": pair_verdicts(runs, TARGET, BUDGET),
    }


def _verdicts(pair: dict) -> dict[str, str]:
    names = ("time_to_target", "accuracy_at_budget", "area_under_curve", "equal_steps")
    return {name: pair[name]["verdict"] for name in names if pair.get(name)}


def test_a_clearly_faster_exact_mode_is_faster_on_every_metric_and_at_equal_steps(tmp_path):
    results = _comparison(tmp_path, {"sync": 1.0, "streaming": 0.75})
    pair = results["verdicts"]["pairs"]["streaming vs sync"]
    assert (pair["mode"], pair["against"], pair["seeds"]) == ("streaming", "sync", [*range(6)])
    assert _verdicts(pair) == dict.fromkeys(
        ("time_to_target", "accuracy_at_budget", "area_under_curve", "equal_steps"), "faster"
    )
    steps = pair["equal_steps"]
    assert steps["steps"] == 8 and steps["accuracy_equal_at_every_step"]
    assert steps["median"] == pytest.approx(1 / 0.75, rel=0.05)  # sync's time over streaming's
    assert steps["ci"][0] > 1 and len(steps["per_step"]) == 8
    assert pair["time_to_target"]["seeds_to_separate"] is None  # separated already
    lines = verdict_lines(results)
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0] == "compare: streaming vs sync, paired over 6 seeds (95% CIs):"
    assert lines[1].startswith("compare:   time to 0.6: faster, 1.3")
    assert lines[4].startswith("compare:   equal steps (8): faster, 1.3")
    json.dumps(results, allow_nan=False)  # results.json is strict JSON


def test_a_clearly_slower_mode_is_slower_and_not_compared_at_equal_steps(tmp_path):
    results = _comparison(tmp_path, {"sync": 1.0, "async-k1": 1.5})
    pair = results["verdicts"]["pairs"]["async-k1 vs sync"]
    assert _verdicts(pair) == dict.fromkeys(
        ("time_to_target", "accuracy_at_budget", "area_under_curve"), "slower"
    )
    assert "equal_steps" not in pair  # async's updates are not sync's: no equal-step claim


def test_two_modes_of_one_distribution_are_not_distinguishable(tmp_path):
    """Same step times and accuracies in distribution, 12 seeds, seed-to-seed noise 30 %
    per step: the CIs straddle no difference, and the estimate asks for more seeds."""
    results = _comparison(tmp_path, {"sync": 1.0, "async-k1": 1.0}, seeds=12, jitter=0.3)
    pair = results["verdicts"]["pairs"]["async-k1 vs sync"]
    assert set(_verdicts(pair).values()) == {UNDECIDED}
    for name in ("time_to_target", "accuracy_at_budget", "area_under_curve"):
        stat = pair[name]
        assert stat["seeds_to_separate"] is None or stat["seeds_to_separate"] > 12, stat
        assert stat["seeds_to_separate_text"], stat
    lines = verdict_lines(results)
    assert "compare:   time to 0.6: not distinguishable, " in "\n".join(lines)
    assert any(line.startswith("compare:     at 12 seeds; ") for line in lines), lines
    assert all(len(line) <= 80 for line in lines), lines


def test_three_seeds_that_agree_are_not_yet_a_verdict(tmp_path):
    """At 3 seeds the widest interval, [min, max], covers the median 75 % of the
    time: two modes of one distribution would be called apart a quarter of the time. Every
    seed agreeing is not a verdict until ``MIN_SEEDS``, and the estimate says so."""
    assert MIN_SEEDS == 6
    results = _comparison(tmp_path, {"sync": 1.0, "streaming": 0.75}, seeds=3)
    stat = results["verdicts"]["pairs"]["streaming vs sync"]["time_to_target"]
    assert stat["ci"][0] > 1 and stat["verdict"] == UNDECIDED
    assert stat["seeds_to_separate"] == 6
    assert "compare:     at 3 seeds; about 6 seeds would separate them at this variance" in (
        verdict_lines(results)
    )


def test_all_pairs_baseline_first_and_one_seed_decides_nothing(tmp_path):
    results = _comparison(tmp_path, {"async-k1": 1.5, "sync": 1.0, "streaming": 0.5}, seeds=1)
    pairs = results["verdicts"]["pairs"]
    assert list(pairs) == ["async-k1 vs sync", "streaming vs sync", "streaming vs async-k1"]
    assert "equal_steps" in pairs["streaming vs sync"]
    assert "equal_steps" not in pairs["streaming vs async-k1"]
    stat = pairs["streaming vs sync"]["time_to_target"]
    assert stat["verdict"] == UNDECIDED  # one seed's CI is a point: it separates nothing
    assert (
        stat["seeds_to_separate_text"] == "seeds to separate them not estimable: fewer than 2 seeds"
    )


def test_a_mode_that_never_reaches_the_target(tmp_path):
    rng = random.Random(3)
    runs = []
    for seed in range(MIN_SEEDS):
        step_s = [rng.uniform(1.0, 2.0) for _ in ACCURACY[1:]]
        runs.append(_run(tmp_path, "sync", seed, step_s, ACCURACY))
        runs.append(_run(tmp_path, "async-k1", seed, step_s, [0.2] * len(ACCURACY)))
    pair = pair_verdicts(runs, TARGET, BUDGET)["pairs"]["async-k1 vs sync"]
    assert pair["time_to_target"]["per_seed"] == [0.0] * MIN_SEEDS  # never: a speed-up of 0
    assert pair["time_to_target"]["verdict"] == "slower"
    flipped = pair_verdicts(runs, 0.9, BUDGET)["pairs"]["async-k1 vs sync"]  # neither gets there
    assert flipped["time_to_target"]["per_seed"] == [1.0] * MIN_SEEDS  # a tie, not a win
    assert flipped["time_to_target"]["verdict"] == UNDECIDED


def test_equal_steps_says_when_the_exact_modes_accuracy_differs(tmp_path):
    runs = [
        _run(tmp_path, "sync", 0, [2.0] * 8, ACCURACY),
        _run(tmp_path, "streaming", 0, [1.0] * 8, ACCURACY[:4] + [0.9] + ACCURACY[5:]),
    ]
    results = {
        "target": TARGET,
        "budget_s": BUDGET,
        "verdicts": pair_verdicts(runs, TARGET, BUDGET),
    }
    steps = results["verdicts"]["pairs"]["streaming vs sync"]["equal_steps"]
    assert not steps["accuracy_equal_at_every_step"]
    assert steps["accuracy_unequal_at"] == [{"seed": 0, "step": 4}]
    assert steps["median"] == 2.0 and steps["per_step"] == [2.0] * 8
    assert "compare:     but accuracy differs at seed 0 step 4: not the same updates" in (
        verdict_lines(results)
    )


def test_the_seeds_to_separate_follow_the_formula():
    """n = ceil((1.96 s / |mean|)^2), at least 2: differences -1 and 3 have mean 1 and
    standard deviation 2√2, so (1.96 · 2.83)^2 = 30.7 → 31."""
    assert seeds_to_separate([-1.0, 3.0]) == (31, "")
    assert seeds_to_separate([1.0, 2.0, 3.0]) == (2, "")  # (1.96 · 1 / 2)^2 < 1
    assert seeds_to_separate([0.5]) == (None, "fewer than 2 seeds")
    assert seeds_to_separate([-1.0, 1.0]) == (None, "the mean difference is 0")
    almost_equal = paired([1.0, -0.99], ratio=False)  # 2 seeds, mean 0.005, sd 1.4
    assert almost_equal["seeds_to_separate"] > 1000
    assert almost_equal["seeds_to_separate_text"] == (
        "over 1000 seeds would separate them at this variance"
    )


def test_the_area_under_the_curve_is_the_mean_accuracy_over_the_budget():
    curve = [Point(0, 0.0, 0.1), Point(2, 10.0, 0.5), Point(4, 20.0, 0.85), Point(6, 30.0, 0.9)]
    # 0.1 for 10 s, 0.5 for 10 s, 0.85 for the last 5 s of 25
    assert area_under_curve(curve, 25.0) == pytest.approx((1.0 + 5.0 + 4.25) / 25)
    assert area_under_curve(curve, 0.0) is None
    assert math.isclose(area_under_curve([Point(0, 0.0, 0.3)], 5.0), 0.3)


def test_the_guides_example_is_what_these_curves_print(tmp_path):
    """docs/guides/compare-eval.md shows the lines for 6 seeds of three modes: async(1)
    drawn from sync's distribution, streaming's steps 0.75 of sync's."""
    guide = (Path(__file__).parents[3] / "docs/guides/compare-eval.md").read_text()
    shown = guide.split("On synthetic curves", 1)[1].split("```text\n", 1)[1].split("```")[0]
    speed = {"sync": 1.0, "async-k1": 1.0, "streaming": 0.75}
    results = _comparison(tmp_path, speed, seeds=6, jitter=0.3)
    assert shown.splitlines() == verdict_lines(results)
