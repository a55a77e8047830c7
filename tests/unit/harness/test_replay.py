"""The simulator replaying a run folder against hand-computed schedules, on synthetic run folders
(``run_folders.py``); the pass-cost fits it uses are ``test_critical_path.py``'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.critical_path import bound, step_windows
from harness.replay import replay_run
from tests.unit.harness.run_folders import sync_step, write_run


def test_replaying_a_sync_run_predicts_slowest_reward_then_learning(tmp_path):
    steps = [
        sync_step(0.0, (0.5, 1.0)),
        sync_step(2.0, (0.2, 0.8)),
        sync_step(4.0, (0.3, 1.2)),
        sync_step(6.0, (0.1, 0.9)),
    ]
    # step 3's learning ran 0.2 s longer than the others': the replay's cost is the median
    steps[2]["spans"][0] = ("step", 5.2, 5.9)
    steps[2]["end"] += 0.2
    result = replay_run(write_run(tmp_path / "sync", {"mode": "sync"}, steps))
    # steps 2-4 (the first is a warm-up): max reward + (0.4 / 2 items) · 2 + 0.1 + 0.05
    assert result["predicted_step_time_s"] == pytest.approx(0.9 + 0.55)
    assert result["measured_step_time_s"] == pytest.approx(0.9 + 0.55)
    assert result["cost_per_item_s"] == pytest.approx(0.2) and result["mode"] == "sync"


def test_simulate_on_a_run_folder_prints_the_runs_own_replay_beside_its_measurement(
    tmp_path, capsys
):
    """``thundersync simulate --workload RUN`` shows what the benchmark checks: the run replayed
    in its own mode beside its measured step time; too short a run says why it is not."""
    from thundersync.cli import main

    steps = [sync_step(2.0 * n, (0.5, 1.0)) for n in range(4)]
    run = write_run(tmp_path / "sync", {"mode": "sync"}, steps)
    assert main(["simulate", "--workload", str(run)]) == 0
    out = capsys.readouterr().out
    assert "the run replayed in its own mode (sync, its costs from its spans): predicted" in out
    assert "measured 1.550 s (+0.0%)" in out
    short = write_run(tmp_path / "short", {"mode": "sync"}, steps[:2])
    assert main(["simulate", "--workload", str(short)]) == 0
    assert "not replayed in its own mode: " in capsys.readouterr().out


def test_replaying_early_start_streaming_waits_for_the_last_reward(tmp_path):
    def step(start: float) -> dict:
        # episodes complete at +0.1 and +0.2, their backwards (0.1 s each, one pass each) run
        # at once, but the last reward only comes at +1.0: then a 0.05 s step and publish
        return {
            "start": start,
            "end": start + 1.1,
            "completed": (start + 0.1, start + 0.2),
            "rewards": (start + 0.5, start + 1.0),
            "spans": [
                ("backward", start + 0.1, start + 0.2),
                ("backward", start + 0.2, start + 0.3),
                ("step", start + 1.0, start + 1.05),
                ("weight_publish", start + 1.05, start + 1.1),
            ],
        }

    config = {"mode": "streaming", "early_start": True}
    result = replay_run(write_run(tmp_path / "early", config, [step(0.0), step(2.0), step(4.0)]))
    assert result["early_start"] and result["cost_per_item_s"] == pytest.approx(0.1)
    assert result["predicted_step_time_s"] == pytest.approx(1.1)
    assert result["error"] == pytest.approx(0.0, abs=1e-9)
    config["early_start"] = False
    late = replay_run(write_run(tmp_path / "late", config, [step(0.0), step(2.0), step(4.0)]))
    # reward-triggered: work starts at each reward, so the last piece ends at 1.1 and closes at 1.2
    assert late["predicted_step_time_s"] == pytest.approx(1.2)


def test_an_opd_step_closes_no_earlier_than_its_last_episode_ends(tmp_path):
    """OPD's work items are turns, ready at their teacher scores; but an episode's last tool
    call runs after its last scored action, and until the episode ends another turn may come.
    So the bound cannot close a step before the last episode ends, and the replay closes it
    when the run does, once every reward is in (both read 0.5 s too early without it)."""

    def step(start: float, mode: str) -> dict:
        # turns scored at +0.1 and +0.2 (0.1 s of learning each); the last episode ends and is
        # graded at +0.8; then the optimizer (0.05 s) and publishing (0.05 s)
        spans = [("step", start + 0.8, start + 0.85), ("optimizer", start + 0.8, start + 0.85)]
        if mode == "sync":  # the whole batch learned once it is complete
            spans = [("step", start + 0.8, start + 1.05), ("optimizer", start + 1.0, start + 1.05)]
        else:
            spans += [
                ("backward", start + 0.1, start + 0.2),
                ("backward", start + 0.2, start + 0.3),
            ]
        end = spans[0][2] + 0.05
        return {
            "start": start,
            "end": end,
            "teacher": (start + 0.1, start + 0.2),
            "completed": (start + 0.3, start + 0.8),
            "rewards": (start + 0.3, start + 0.8),
            "spans": [*spans, ("weight_publish", end - 0.05, end)],
        }

    for mode, measured in (("sync", 1.1), ("streaming", 0.9)):
        steps = [step(2.0 * n, mode) for n in range(4)]
        run = write_run(tmp_path / mode, {"mode": mode}, steps)
        result = replay_run(run)
        assert result["measured_step_time_s"] == pytest.approx(measured)
        assert result["predicted_step_time_s"] == pytest.approx(measured)
    (window, *_) = step_windows(tmp_path / "streaming")
    # each turn charged 0.1 s from its score would close at 0.3; the last episode ends at 0.8
    assert bound(window, 0.1) == pytest.approx(0.8 + 0.05 + 0.05)


def test_replaying_async_predicts_the_pipelines_throughput(tmp_path):
    # async(1): batches 0 and 1 start at 0; batch n >= 2 when step n-1 has ended. Every batch
    # is ready 1.0 s after its start and its learning takes 0.3 s (+ 0.1 optimizer): the
    # learner is the slack side, so a step ends every 1.4 s once the pipeline is full
    # (step n ends at 1.4 + ... : 1.4, 1.8, 2.8, 3.2, 4.2, 4.6).
    ends = [1.4, 1.8, 2.8, 3.2, 4.2, 4.6]
    starts = [0.0, 0.0, 1.4, 1.8, 2.8, 3.2]
    steps = []
    for start, end in zip(starts, ends):
        learn = end - 0.4
        steps.append(
            {
                "start": start,
                "end": end,
                "rewards": (start + 0.5, start + 1.0),
                "spans": [("step", learn, end), ("optimizer", end - 0.1, end)],
            }
        )
    result = replay_run(write_run(tmp_path / "async", {"mode": "async", "staleness": 1}, steps))
    assert result["mode"] == "async-k1"
    assert result["measured_step_time_s"] == pytest.approx((4.6 - 1.8) / 4)
    assert result["predicted_step_time_s"] == pytest.approx((4.6 - 1.8) / 4)
    short = write_run(tmp_path / "short", {"mode": "async", "staleness": 2}, steps[:3])
    with pytest.raises(ValueError, match="at least 5 complete steps"):
        replay_run(short)


def test_an_async_runs_throughput_is_not_moved_by_one_slow_step():
    """async(1)'s batches end in pairs (0.1 s, then 0.5 s apart): 0.3 s a step once full. One
    step 1.2 s late (the learner's first steps; a stalled generation call) would put the mean
    interval at 0.4 s; the median over windows of two intervals stays at 0.3 s, and a run
    too short for a window of two is measured by its one interval."""
    from harness.replay import step_time
    from thundersync.training.modes import AsyncMode

    ends = [0.0, 0.5]
    for _ in range(6):
        ends += [ends[-1] + 0.1, ends[-1] + 0.6]
    history = [{"submitted_at": 0.0, "finished_at": t} for t in ends]
    assert step_time(history, AsyncMode(1)) == pytest.approx(0.3)
    slow = [{"submitted_at": 0.0, "finished_at": t + 1.2 * (n >= 4)} for n, t in enumerate(ends)]
    assert (ends[-1] + 1.2 - ends[1]) / (len(ends) - 2) == pytest.approx(0.3 + 1.2 / 12)
    assert step_time(slow, AsyncMode(1)) == pytest.approx(0.3)
    assert step_time(history[:3], AsyncMode(1)) == pytest.approx(0.1)


def streaming_run(folder: Path, config: dict, step: dict, steps: int = 4) -> Path:
    """A run of ``steps`` copies of ``step`` (times from its batch's start), 2 s apart."""
    copies = []
    for n in range(steps):
        at = 2.0 * n
        copies.append(
            {
                "start": at,
                "end": at + step["end"],
                "episodes": [(e, k, at + c, at + r) for e, k, c, r in step["episodes"]],
                "spans": [(name, at + lo, at + hi, *rest) for name, lo, hi, *rest in step["spans"]],
            }
        )
    return write_run(folder, config, copies)


def test_a_closing_pass_of_long_trajectories_costs_its_padded_tokens(tmp_path):
    """The replay charges a pass by its padded tokens: o = 10 ms a micro-batch and 1 ms a
    token here. Two short trajectories close their group at 0.1 s (a pass of 2 × 10 tokens,
    30 ms), two long ones theirs at 0.5 s (2 × 100 tokens, 210 ms): 0.5 + 0.21 + 0.1. One cost
    per item and pass (the old model: 60 ms an item) read 0.72 s, the short pass as dear as
    the long."""
    step = {
        "end": 0.81,
        "episodes": [("g0-e0", 10, 0.05, 0.1), ("g0-e1", 10, 0.05, 0.1)]
        + [("g1-e0", 100, 0.4, 0.5), ("g1-e1", 100, 0.4, 0.5)],
        "spans": [
            ("backward", 0.1, 0.13, "g0-e0"),
            ("backward", 0.1, 0.13, "g0-e1"),
            ("backward", 0.5, 0.71, "g1-e0"),
            ("backward", 0.5, 0.71, "g1-e1"),
            ("step", 0.71, 0.76),
            ("weight_publish", 0.76, 0.81),
        ],
    }
    result = replay_run(streaming_run(tmp_path / "run", {"mode": "streaming"}, step))
    assert result["pass_overhead_s"] == pytest.approx(0.01)
    assert result["forward_per_token_s"] == pytest.approx(0.001)
    assert result["measured_step_time_s"] == pytest.approx(0.81)
    assert result["predicted_step_time_s"] == pytest.approx(0.81)


def test_the_replay_drains_per_group_as_the_streaming_learner_does(tmp_path):
    """Rewarded trajectories of an open group go in one deposit (with a KL term three
    backwards), a lone one is its own piece (two), a closed group's are finals (one); each
    pass pays o. o = 10 ms, f = 0.5 ms a token for each of the two forwards (the policy's and
    the reference's) and g = 0.5 ms a token per backward: at 0.1 s g0's two deposit (60 ms),
    at 0.2 s g1-e0 is a piece (110 ms), at 0.31 s g1 has closed and g1-e1 is final (85 ms),
    at 0.6 s g0-e2 closes g0 (40 ms): 0.64 + 0.1. One pass of everything arrived at a cost
    per item (the old model) read 0.759 s."""
    step = {
        "end": 0.74,
        "episodes": [("g0-e0", 10, 0.05, 0.1), ("g0-e1", 10, 0.05, 0.1), ("g0-e2", 20, 0.5, 0.6)]
        + [("g1-e0", 50, 0.15, 0.2), ("g1-e1", 50, 0.25, 0.3)],
        "spans": [
            ("backward", 0.1, 0.16, "g0-e0"),
            ("backward", 0.1, 0.16, "g0-e1"),
            ("backward", 0.2, 0.31, "g1-e0"),
            ("backward", 0.31, 0.395, "g1-e1"),
            ("backward", 0.6, 0.64, "g0-e2"),
            ("step", 0.64, 0.69),
            ("weight_publish", 0.69, 0.74),
        ],
    }
    config = {"mode": "streaming", "objective": {"kl_coef": 0.04}}
    result = replay_run(streaming_run(tmp_path / "run", config, step))
    assert result["pass_overhead_s"] == pytest.approx(0.01)
    assert result["forward_per_token_s"] == pytest.approx(0.0005)
    assert result["backward_per_token_s"] == pytest.approx(0.0005)
    assert result["predicted_step_time_s"] == pytest.approx(0.74)


def test_with_early_start_each_unrewarded_trajectory_is_its_own_piece(tmp_path):
    """Early start: two trajectories complete unrewarded at 0.1 s, a piece each (50 ms: o =
    10 ms, 40 tokens at 1 ms), and their rewards then cost nothing; a third completes at 0.55
    s (20 ms). The step closes at its last reward, 0.56 s, or its last piece, 0.57 s: 0.57 +
    0.1. As one pass of the two at a cost per item (the old model) it read 0.69 s."""
    step = {
        "end": 0.67,
        "episodes": [("g0-e0", 40, 0.1, 0.5), ("g0-e1", 40, 0.1, 0.12), ("g1-e0", 10, 0.55, 0.56)],
        "spans": [
            ("backward", 0.1, 0.15, "g0-e0"),
            ("backward", 0.15, 0.2, "g0-e1"),
            ("backward", 0.55, 0.57, "g1-e0"),
            ("step", 0.57, 0.62),
            ("weight_publish", 0.62, 0.67),
        ],
    }
    config = {"mode": "streaming", "early_start": True}
    run = holding(streaming_run(tmp_path / "run", config, step))
    result = replay_run(run)
    assert result["early_start"] and result["pass_overhead_s"] == pytest.approx(0.01)
    assert result["predicted_step_time_s"] == pytest.approx(0.67)


def holding(run: Path) -> Path:
    """``run`` with its learner's buffers past two per group and one more (4 copies, one task
    per step): early start held whole pieces, as only a budget with room for them allows."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    learner = {"peak_buffer_bytes": 4, "buffer_bytes": 1}
    rows = [json.dumps({**json.loads(line), "learner": learner}) + "\n" for line in lines]
    (run / "metrics.jsonl").write_text("".join(rows))
    return run


def test_with_early_start_in_two_buffers_per_group_the_work_is_split(tmp_path):
    """Early start within two buffers per open group (docs/design.md §3): at completion each
    group's Σ hᵢ (g0's two at 0.1 s: 80 tokens, 130 ms; g1's at 0.3 s: 25 ms); at a reward of
    a still open group its (rᵢ − c) hᵢ (g0-e0 at 0.5 s: 70 ms); once its group has closed,
    the rest with the finals (g1-e0 at 0.35 s, 25 ms; g0-e1 at 0.6 s, 70 ms): 0.67 + 0.1.
    Holding whole pieces instead, the rewards would cost nothing: 0.6 + 0.1."""
    step = {
        "end": 0.77,
        "episodes": [("g0-e0", 40, 0.1, 0.5), ("g0-e1", 40, 0.1, 0.6), ("g1-e0", 10, 0.3, 0.35)],
        "spans": [
            ("backward", 0.1, 0.23, "g0-e0"),
            ("backward", 0.1, 0.23, "g0-e1"),
            ("backward", 0.3, 0.325, "g1-e0"),
            ("backward", 0.35, 0.375, "g1-e0"),
            ("backward", 0.5, 0.57, "g0-e0"),
            ("backward", 0.6, 0.67, "g0-e1"),
            ("step", 0.67, 0.72),
            ("weight_publish", 0.72, 0.77),
        ],
    }
    config = {"mode": "streaming", "early_start": True}
    split = replay_run(streaming_run(tmp_path / "split", config, step))
    assert split["predicted_step_time_s"] == pytest.approx(0.77)
    held = replay_run(holding(streaming_run(tmp_path / "held", config, step)))
    assert held["predicted_step_time_s"] == pytest.approx(0.70)


def test_sync_learning_is_charged_by_each_batchs_padded_tokens(tmp_path):
    """The sync learner's time is 1 ms per padded token here, and the batches differ: two
    trajectories of 10 tokens (one micro-batch, 20 ms) or of 10 and 100 (two, 100 being more
    than twice 10: 110 ms). Charged by its own batch, each step replays exactly; at the median
    cost per trajectory (the old model, 55 ms) the median step read 0.05 s long."""

    def step(start: float, last: float, long: int) -> dict:
        learn = 0.001 * (2 * long if long == 10 else 10 + long)
        end = start + last + learn + 0.1
        return {
            "start": start,
            "end": end,
            "episodes": [("g0-e0", 10, start, start + 0.1), ("g0-e1", long, start, start + last)],
            "spans": [
                ("step", start + last, end - 0.05),
                ("optimizer", end - 0.1, end - 0.05),
                ("weight_publish", end - 0.05, end),
            ],
        }

    steps = [step(0.0, 1.0, 10), step(2.0, 0.5, 100), step(4.0, 0.6, 100), step(6.0, 0.55, 10)]
    result = replay_run(write_run(tmp_path / "sync", {"mode": "sync"}, steps))
    # steps 2-4: 0.5 + 0.11, 0.6 + 0.11, 0.55 + 0.02 (+ 0.1): the median is 0.71
    assert result["measured_step_time_s"] == pytest.approx(0.71)
    assert result["forward_per_token_s"] == pytest.approx(0.001)
    assert result["predicted_step_time_s"] == pytest.approx(0.71)


def test_replaying_async_charges_the_intake_before_each_step(tmp_path):
    """A learner-bound async(1) run: every batch is ready 0.2 s after its start, and the
    learner starts its step 50 ms after it could (the trainer taking in the events that
    queued while it stepped), then learns 0.3 s and steps 0.1 s: a step every 0.45 s. Without
    the intake (the old model) the replay read 0.40 s."""
    starts, steps, free = [0.0, 0.0], [], 0.0
    for n in range(6):
        if n >= 2:
            starts.append(steps[n - 2]["end"])
        begin = max(free, starts[n] + 0.2) + 0.05
        free = begin + 0.4
        steps.append(
            {
                "start": starts[n],
                "end": free,
                "rewards": (starts[n] + 0.1, starts[n] + 0.2),
                "spans": [("step", begin, free), ("optimizer", free - 0.1, free)],
            }
        )
    result = replay_run(write_run(tmp_path / "async", {"mode": "async", "staleness": 1}, steps))
    assert result["intake_s"] == pytest.approx(0.05)
    assert result["measured_step_time_s"] == pytest.approx(0.45)
    assert result["predicted_step_time_s"] == pytest.approx(0.45)


def test_a_one_step_run_is_summarised_from_its_only_step(tmp_path):
    """``compare --steps 1`` summarised its runs by leaving out the first step: none was left."""
    from harness.critical_path import summarize

    run = write_run(tmp_path / "one", {"mode": "sync"}, [sync_step(0.0, (0.5, 1.0))])
    summary = summarize(run, 0.2)
    assert summary["steps"] == 1 and summary["step_time_s"] == pytest.approx(1.55)
    # T*: the first trajectory's learning runs before the second reward: 1.0 + 0.2 + 0.15
    assert summary["efficiency"] == pytest.approx(1.35 / 1.55)


def test_simulate_takes_a_run_folder_as_timeline_and_export_do(tmp_path, capsys):
    """``timeline RUN_DIR`` and ``export RUN_DIR`` take the folder itself: so does simulate."""
    from thundersync.cli import main

    steps = [sync_step(2.0 * n, (0.5, 1.0)) for n in range(4)]
    run = write_run(tmp_path / "sync", {"mode": "sync"}, steps)
    assert main(["simulate", str(run)]) == 0
    assert "the run replayed in its own mode (sync" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flag, make, message",
    [
        (
            "--project",
            "run",
            "is a run folder, not a projection file: give a run folder as `thundersync simulate ",
        ),
        ("--workload", "missing", "no such run folder"),
        ("", "empty", "not a run folder (no metrics.jsonl)"),
    ],
)
def test_a_folder_given_to_the_wrong_flag_names_the_right_one(
    tmp_path, capsys, flag, make, message
):
    from thundersync.cli import main

    steps = [sync_step(2.0 * n, (0.5, 1.0)) for n in range(4)]
    folder = {
        "run": lambda: write_run(tmp_path / "sync", {"mode": "sync"}, steps),
        "missing": lambda: tmp_path / "runs" / "nothing-here",
        "empty": lambda: tmp_path,
    }[make]()
    code = main(["simulate", *([flag] if flag else []), str(folder)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
