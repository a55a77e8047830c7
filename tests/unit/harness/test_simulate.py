"""The simulator's schedules against hand-computed cases, and its ordering guarantees."""

from __future__ import annotations

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
