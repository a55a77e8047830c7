"""pass@k against hand-computed cases, medians and their intervals, curves and the bound T*."""

from __future__ import annotations

import json
import random
from math import comb

import pytest

from harness.critical_path import StepWindow, bound, step_windows
from harness.curves import Point, accuracy_at_budget, time_to_target
from harness.intervals import coverage, median_ci, order_k
from harness.passk import mean_pass_at_k, pass_at_k


def test_pass_at_k_matches_hand_computed_cases():
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - comb(7, 5) / comb(10, 5))  # 11/12
    assert pass_at_k(10, 3, 5) == pytest.approx(11 / 12)
    assert pass_at_k(3, 2, 2) == 1.0  # any 2 of 3 include a pass
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_mean_pass_at_k_skips_tasks_with_too_few_scored_attempts():
    outcomes = [[True, False], [False, False], [True]]
    assert mean_pass_at_k(outcomes, 1) == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert mean_pass_at_k(outcomes, 2) == pytest.approx((1.0 + 0.0) / 2)
    assert mean_pass_at_k(outcomes, 3) is None


def test_median_and_ci_treat_a_missing_seed_as_never():
    stat = median_ci([10.0, 12.0, 11.0])
    assert stat["median"] == 11.0 and stat["ci"] == [10.0, 12.0]  # 3 seeds: [min, max], 75 %
    assert stat["coverage"] == pytest.approx(0.75)
    assert median_ci([10.0, None, None])["median"] is None  # two of three never got there
    assert median_ci([10.0, 20.0, None])["ci"][1] is None
    json.dumps(median_ci([1.0, None]), allow_nan=False)
    assert median_ci([]) == {"median": None, "ci": [None, None], "coverage": None, "per_seed": []}


@pytest.mark.parametrize(
    ("n", "k", "covers"),
    # 1 - 2 * sum(C(n, i) for i < k) / 2**n, by hand
    [(6, 1, 1 - 2 / 64), (8, 1, 1 - 2 / 256), (9, 2, 1 - 20 / 512), (12, 3, 1 - 2 * 79 / 4096)],
)
def test_the_interval_is_the_widest_order_statistics_that_keep_95_percent(n, k, covers):
    """The sign test's interval: the k-th value from each end, k the largest whose coverage
    is at least 95 % (the next narrower one is below it)."""
    assert order_k(n, 0.95) == k and coverage(n, k) == pytest.approx(covers)
    assert coverage(n, k) >= 0.95 > coverage(n, k + 1)
    values = [float(v) for v in range(n, 0, -1)]  # n .. 1, unsorted on purpose
    stat = median_ci(values)
    assert stat["ci"] == [float(k), float(n + 1 - k)]
    assert stat["coverage"] == pytest.approx(covers)


def test_the_interval_covers_the_median_as_often_as_it_says():
    """Skewed samples (log-normal, median 1) at 6 and 9 seeds: the interval holds the true
    median at least as often as its stated coverage, less sampling error (600 draws)."""
    rng = random.Random(11)
    for n in (6, 9):
        draws = [[rng.lognormvariate(0.0, 1.0) for _ in range(n)] for _ in range(600)]
        held = sum(lo <= 1.0 <= hi for lo, hi in (median_ci(d)["ci"] for d in draws))
        assert held / 600 >= coverage(n, order_k(n, 0.95)) - 0.03, (n, held)


def test_time_to_target_and_accuracy_at_budget_read_the_checkpoints():
    curve = [Point(0, 0.0, 0.1), Point(2, 10.0, 0.5), Point(4, 20.0, 0.85), Point(6, 30.0, 0.7)]
    assert time_to_target(curve, 0.8) == 20.0 and time_to_target(curve, 0.9) is None
    assert accuracy_at_budget(curve, 25.0) == 0.85 and accuracy_at_budget(curve, 9.9) == 0.1


def test_the_bound_is_the_critical_path_of_rewards_and_learner_work():
    window = StepWindow(
        0, 100.0, 110.0, (101.0, 102.0, 109.0), {"optimizer": 0.5, "weight_publish": 0.25}
    )
    # max(1 + 3b, 2 + 2b, 9 + b) with b = 1 is 10; plus 0.75 of optimizer and sync
    assert bound(window, 1.0) == pytest.approx(10.75)
    # learner-bound: with b = 4 the first reward's chain dominates: 1 + 12
    assert bound(window, 4.0) == pytest.approx(13.75)


@pytest.mark.parametrize("numbering", [{"step": 0}, {"step": 1, "step_base": 1}])
def test_step_windows_read_a_run_folder(tmp_path, numbering):
    """Step 1 trains on batch 0 (episode ids s0-…), in a run whose metrics count steps from
    1 and in an old one whose metrics counted from 0."""
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({**numbering, "submitted_at": 1.0, "finished_at": 5.0}) + "\n"
    )
    events = [
        {"event": "RewardReady", "t": 3.0, "episode_id": "s0-g0-e0"},
        {"event": "RewardReady", "t": 9.0, "episode_id": "v-g0-e0"},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    spans = [
        {"name": "optimizer", "started": 4.0, "finished": 4.5, "worker": "learner"},
        {"name": "engine", "started": 1.0, "finished": 2.0, "worker": "engine"},
    ]
    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
    (window,) = step_windows(tmp_path)
    assert window.reward_times == (3.0,) and window.durations == {"optimizer": 0.5}
    assert window.time_s == 4.0 and window.step == 1


def test_the_compare_verdict_names_every_mode_and_fits_80_columns():
    from harness.compare_report import verdict

    def mode(time_s, speedup, accuracy):
        return {
            "time_to_target_s": {"median": time_s, "per_seed": [time_s] * 3},
            "speedup_vs_sync": {"median": speedup},
            "accuracy_at_budget": {"median": accuracy},
        }

    results = {
        "target": 0.6,
        "budget_s": 41.2,
        "modes": {
            "sync": mode(21.0, 1.0, 0.61),
            "async-k1": mode(None, 0.14, 0.42),
            "streaming": mode(14.3, 1.58, 0.58),
        },
    }
    lines = verdict(results).splitlines()
    assert lines == [
        "compare: median time to 0.6 (3 seeds): sync 21 s, async-k1 never, streaming 14 s",
        "compare: median per-seed speed-up vs sync: async-k1 never, streaming 1.58x",
        "compare: accuracy at 41 s: sync 0.61, async-k1 0.42, streaming 0.58",
    ]
    assert all(len(line) <= 80 for line in lines)


def test_the_strict_bound_charges_each_trajectory_its_tokens_share(tmp_path):
    """A short trajectory ready early and a long one ready last: charged L_sync / N each, the
    long one's work would look cheap; charged by tokens it is most of the learner's time."""
    from harness.critical_path import batched_cost
    from tests.unit.harness.run_folders import write_run

    def step(start: float) -> dict:
        # two trajectories of 10 and 90 tokens rewarded at +0.1 and +1.0; 2.0 s of learning
        # (a 2.5 s step less its 0.5 s optimizer), then 0.25 s publishing weights
        return {
            "start": start,
            "end": start + 3.75,
            "episodes": [
                ("g0-e0", 10, start + 0.05, start + 0.1),
                ("g0-e1", 90, start + 0.9, start + 1.0),
            ],
            "spans": [
                ("step", start + 1.0, start + 3.5),
                ("optimizer", start + 3.0, start + 3.5),
                ("weight_publish", start + 3.5, start + 3.75),
            ],
        }

    sync = write_run(tmp_path / "sync", {"mode": "sync"}, [step(0.0), step(10.0)])
    cost = batched_cost(sync)
    assert cost.per_item == pytest.approx(1.0)  # 2.0 s over 2 trajectories
    assert cost.per_token == pytest.approx(0.02)  # 2.0 s over 100 tokens
    (window, _) = step_windows(sync)
    # per item: max(0.1 + 2 × 1.0, 1.0 + 1.0) = 2.1; per token: max(0.1 + 0.2 + 1.8, 1.0 + 1.8)
    # = 2.8; each plus 0.5 + 0.25 of optimizer and publishing
    assert bound(window, cost.per_item) == pytest.approx(2.85)
    assert bound(window, cost) == pytest.approx(3.55)
    # early start: the long one's backward may begin at its completion, +0.9
    assert bound(window, cost, early_start=True) == pytest.approx(0.9 + 1.8 + 0.75)
