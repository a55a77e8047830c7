"""The learner's pass-cost fits and what ``step_windows`` reads of a run folder (its passes,
teacher scores, intervals and tokens), on synthetic run folders (``run_folders.py``)."""

from __future__ import annotations

import json

import pytest

from harness.critical_path import (
    LearnerPass,
    StepWindow,
    bound,
    pass_cost,
    step_windows,
    token_pass_cost,
)
from tests.unit.harness.run_folders import write_run


def passes(*shapes: tuple) -> tuple[LearnerPass, ...]:
    """Passes of (seconds, items[, padded tokens, micro-batches, backwards]), one a second."""
    return tuple(LearnerPass(float(n), shape[0], *shape[1:]) for n, shape in enumerate(shapes))


def test_the_pass_cost_fit_recovers_the_fixed_and_per_item_costs():
    window = StepWindow(
        1, 0.0, 1.0, (), {}, passes=passes(*((0.02 + 0.01 * k, k) for k in (1, 2, 3, 4, 1)))
    )
    o, b = pass_cost([window])
    assert o == pytest.approx(0.02) and b == pytest.approx(0.01)
    same = StepWindow(1, 0.0, 1.0, (), {}, passes=passes((0.06, 2), (0.04, 2)))
    assert pass_cost([same]) == pytest.approx((0.0, 0.025))
    with pytest.raises(ValueError, match="no backward passes"):
        pass_cost([StepWindow(1, 0.0, 1.0, (), {})])


def test_the_token_fit_recovers_the_fixed_forward_and_backward_costs():
    """A pass costs o per micro-batch and, per padded token, f plus g per backward: passes of
    every kind and size recover all three; passes of one kind cannot tell f from g, nor
    passes of one shape o from f: the fit keeps f, the cost per token."""

    def cost(tokens: int, micro_batches: int, backwards: int) -> float:
        return 0.01 * micro_batches + tokens * (0.001 + backwards * 0.0005)

    shapes = [(20, 1, 3), (50, 1, 2), (50, 1, 1), (400, 2, 1), (90, 1, 3)]
    window = StepWindow(1, 0.0, 1.0, (), {}, passes=passes(*((cost(*s), 1, *s) for s in shapes)))
    assert token_pass_cost([window]) == pytest.approx((0.01, 0.001, 0.0005))
    finals = StepWindow(1, 0.0, 1.0, (), {}, passes=passes((0.03, 2, 20, 1), (0.21, 2, 200, 1)))
    assert token_pass_cost([finals]) == pytest.approx((0.01, 0.001, 0.0))
    alike = StepWindow(1, 0.0, 1.0, (), {}, passes=passes((0.3, 32, 1000, 4), (0.2, 32, 1000, 4)))
    assert token_pass_cost([alike]) == pytest.approx((0.0, 0.00025, 0.0))
    with pytest.raises(ValueError, match="padded tokens are unknown"):
        token_pass_cost([StepWindow(1, 0.0, 1.0, (), {}, passes=passes((0.1, 2)))])


def test_step_windows_read_passes_teacher_scores_and_intervals(tmp_path):
    step = {
        "start": 0.0,
        "end": 2.0,
        "rewards": (1.5,),
        "teacher": (0.3, 0.6),
        "spans": [
            ("backward", 0.4, 0.5),
            ("backward", 0.4, 0.6),  # one pass of two items: they share its start
            ("backward", 0.7, 0.75),
        ],
    }
    (window,) = step_windows(write_run(tmp_path / "run", {"mode": "streaming"}, [step]))
    assert [(p.items, p.seconds) for p in window.passes] == [
        (2, pytest.approx(0.2)),
        (1, pytest.approx(0.05)),
    ]
    assert window.teacher_times == (0.3, 0.6) and window.work_times == (0.3, 0.6)
    assert window.step_interval_s == 2.0
    # OPD's bound charges each turn from its teacher score: max(0.3 + 2, 0.6 + 1)
    assert bound(window, 1.0) == pytest.approx(2.3)


def test_step_windows_read_each_trajectorys_tokens_and_each_passs_shape(tmp_path):
    """A trajectory's tokens are its context (prompt, actions, every observation but the last
    turn's); a pass's padded tokens are its micro-batches' rows × longest, shortest first;
    its backwards by kind: finals (group closed) one, a lone piece two and a batched
    deposit three with a KL term, two where its rewards are one."""
    config = {"mode": "streaming", "micro_batch_size": 2, "objective": {"kl_coef": 0.1}}
    step = {
        "start": 0.0,
        "end": 2.0,
        # group g0 closes at 0.5, g1 at 0.9, g2 at 0.95
        "episodes": [("g0-e0", 10, 0.1, 0.2), ("g0-e1", 30, 0.1, 0.2), ("g0-e2", 20, 0.1, 0.5)]
        + [("g1-e0", 40, 0.1, 0.6), ("g1-e1", 50, 0.1, 0.9), ("g2-e0", 45, 0.1, 0.95)],
        "spans": [
            ("backward", 0.2, 0.3, "g0-e0"),  # a deposit of two: 2 rows x 30
            ("backward", 0.2, 0.3, "g0-e1"),
            ("backward", 0.6, 0.7, "g1-e0"),  # a lone piece
            # finals of the three groups, micro-batches of at most 2 shortest first, none
            # more than twice its first row: (20) and (45, 50)
            ("backward", 1.0, 1.2, "g0-e2"),
            ("backward", 1.0, 1.2, "g1-e1"),
            ("backward", 1.0, 1.2, "g2-e0"),
            ("step", 1.2, 1.3),
        ],
    }
    run = write_run(tmp_path / "run", config, [step])
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    # g0-e0 played two turns: actions of 2 and 3 tokens, observations of 7 and (the last) 5
    two_turns = [
        {"event": "TurnCompleted", "turn": 0, "action_ids_len": 2},
        {"event": "ToolFinished", "turn": 0, "observation_ids_len": 7},
        {"event": "TurnCompleted", "turn": 1, "action_ids_len": 3},
        {"event": "ToolFinished", "turn": 1, "observation_ids_len": 5},
        {"event": "EpisodeCompleted", "num_turns": 2},
    ]
    played = ("TurnCompleted", "EpisodeCompleted")
    events = [e for e in events if e["episode_id"] != "s0-g0-e0" or e["event"] not in played]
    events += [{"t": 0.1, "episode_id": "s0-g0-e0"} | e for e in two_turns]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (window,) = step_windows(run)
    tokens = {e.episode_id.removeprefix("s0-"): e.tokens for e in window.episodes}
    assert tokens == {"g0-e0": 8 + 2 + 7 + 3, "g0-e1": 30, "g0-e2": 20} | {
        "g1-e0": 40,
        "g1-e1": 50,
        "g2-e0": 45,
    }
    assert window.step_started == 1.2
    shapes = [(p.items, p.padded_tokens, p.micro_batches, p.backwards) for p in window.passes]
    assert shapes == [(2, 2 * 30, 1, 3), (1, 40, 1, 2), (3, 20 + 2 * 50, 2, 1)]
    # the deposit's two trajectories passed (or failed) alike: one backward gave Σ hᵢ and
    # Σ cᵢhᵢ (``micro_batches.weight_classes``), one more the KL term's
    alike = {"s0-g0-e0", "s0-g0-e1"}
    events = [
        e | {"reward": 1.0} if e["event"] == "RewardReady" and e["episode_id"] in alike else e
        for e in events
    ]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (window,) = step_windows(run)
    assert [p.backwards for p in window.passes] == [2, 2, 1]
