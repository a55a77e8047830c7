"""The simulator's schedules against hand-computed cases, and its ordering guarantees."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.simulate import (
    Workload,
    async_steps,
    bound_step,
    named_workload,
    simulate,
    streaming_step,
    sync_step,
)

ROOT = Path(__file__).resolve().parents[3]


def workload(ready, b=1.0, o=0.0, opt=0.5, sync=0.25, micro=8) -> Workload:
    return Workload(
        "w", (tuple(ready),), b, o, optimizer_s=opt, sync_s=sync, micro_batch_size=micro
    )


def test_sync_waits_for_the_slowest_then_learns_everything():
    w = workload([1.0, 2.0, 9.0])
    assert sync_step([1.0, 2.0, 9.0], w) == pytest.approx(9.0 + 3.0 + 0.75)


def test_lazy_streaming_drains_what_has_arrived_and_reaches_the_bound_here():
    w = workload([1.0, 2.0, 9.0])
    # learner: 1..2 (first), 2..3 (second), idle, 9..10 (third): 10 + 0.75
    assert streaming_step([1.0, 2.0, 9.0], w) == pytest.approx(10.75)
    assert bound_step([1.0, 2.0, 9.0], w) == pytest.approx(10.75)


def test_a_pass_overhead_makes_eager_streaming_pay_per_trajectory():
    ready = [1.0, 1.0, 1.0, 1.0]
    w = workload(ready, b=1.0, o=0.5)
    assert streaming_step(ready, w) == pytest.approx(1.0 + 0.5 + 4.0 + 0.75)
    assert streaming_step(ready, w, eager=True) == pytest.approx(1.0 + 4 * 1.5 + 0.75)


def test_async_overlaps_rollout_with_learning_at_bounded_staleness():
    w = Workload("w", ((2.0,), (2.0,), (2.0,), (2.0,)), 1.0, optimizer_s=0.0, sync_s=0.0)
    # k=1: batches 0 and 1 start at 0; batch n >= 2 starts when step n-2 is done:
    # steps end at 3, 4, 6 (batch 2 starts at 3), 7 (batch 3 starts at 4)
    assert async_steps(w, 1) == pytest.approx(7.0 / 4)
    assert async_steps(w, 1) < sum(sync_step(r, w) for r in w.ready_s) / 4


@pytest.mark.parametrize("name", ["long-tail", "balanced", "agentic"])
def test_streaming_is_between_the_bound_and_sync_on_every_named_workload(name):
    result = simulate(named_workload(name, steps=10))
    t = result["step_time_s"]
    assert t["bound"] <= t["streaming"] <= t["sync"]
    assert 0.9 < result["efficiency"]["streaming"] <= 1.0


def test_an_unknown_workload_is_named():
    with pytest.raises(ValueError, match="unknown workload 'x'"):
        named_workload("x")


PROJECTION = """
name = "tiny"
rollout_gpus = 2
learner_gpus = 4
generation_tokens_per_s_per_gpu = 100.0
sequence_tokens_per_s = 1000.0
training_tokens_per_s_per_gpu = 25.0
tasks = 2
group = 2
prompt_tokens = 60.0
turns = { median = 2.0 }
action_tokens = { median = 10.0 }
observation_tokens = { median = 5.0 }
tool_s = { median = 0.5 }
grading_s = { median = 10.0 }
optimizer_s = 1.0
weight_sync_s = 0.5
[sources]
turns = "a test"
"""


def test_a_projection_matches_a_hand_computed_cluster(tmp_path):
    from harness.projection import load_projection, project

    path = tmp_path / "tiny.toml"
    path.write_text(PROJECTION)
    p = load_projection(path)
    # 4 sequences share 2 GPUs x 100 tokens/s: 50 tokens/s each (under one sequence's 1000).
    # An episode: 2 turns of 10 / 50 s of decoding and 0.5 s of tools = 1.4 s; its reward at
    # 11.4 s. A trajectory is 60 + 2 x (10 + 5) = 90 tokens, over 4 x 25 tokens/s: 0.9 s.
    result = project(p, steps=3)
    t = result["step_time_s"]
    closing = 1.0 + 0.5
    assert t["sync"] == pytest.approx(11.4 + 4 * 0.9 + closing)
    assert t["streaming"] == pytest.approx(11.4 + 4 * 0.9 + closing)  # all rewards at once
    # early start: the 3.6 s of learning run from 1.4 s, inside the 10 s of grading
    assert t["streaming-early"] == pytest.approx(11.4 + closing)
    assert result["projection"] and result["inputs"]["sources"] == {"turns": "a test"}


@pytest.mark.parametrize(
    "change,message",
    [
        ("rollout_gpus = 0", "rollout_gpus must be an integer from 1"),
        (
            "training_tokens_per_s_per_gpu = -1.0",
            "training_tokens_per_s_per_gpu must be a positive",
        ),
        ("turns = { median = 2.0, mean = 3.0 }", "turns: unknown key(s) mean"),
        ("grading_s = 3.0", "grading_s must be a table with a median"),
        ("colour = 1", "unknown field(s) colour"),
    ],
)
def test_a_bad_projection_file_is_named(tmp_path, change, message):
    from harness.projection import load_projection

    key = change.split(" =")[0]
    lines = [line for line in PROJECTION.splitlines() if not line.startswith(f"{key} =")]
    (tmp_path / "bad.toml").write_text(change + "\n" + "\n".join(lines))
    with pytest.raises(ValueError, match="bad.toml: " + re.escape(message)):
        load_projection(tmp_path / "bad.toml")


def test_the_shipped_projections_print_as_projections_with_their_sources(capsys):
    from thundersync.cli import main

    shipped = sorted((ROOT / "benchmarks" / "projections").glob("*.toml"))
    assert shipped
    for path in shipped:
        assert main(["simulate", "--project", str(path), "--steps", "3"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("simulate: PROJECTION, not a measurement:")
        assert "training_tokens_per_s_per_gpu" in out and "[derived:" in out
    assert main(["simulate", "--project", str(ROOT / "README.md")]) == 2
    assert "not a readable TOML projection file" in capsys.readouterr().err
