"""The real mode objects driven on the simulator's virtual clock against hand-computed cases,
and its ordering guarantees."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from harness.simulate import bound_step, mean_step_time, simulate, step_times
from harness.workload import Item, Workload, named_workload, pass_seconds
from thundersync.training.modes import AsyncMode, StreamingMode, SyncMode

ROOT = Path(__file__).resolve().parents[3]
SYNC, STREAMING = SyncMode(), StreamingMode()


def workload(ready, b=1.0, o=0.0, opt=0.5, sync=0.25, micro=8, **more) -> Workload:
    return Workload(
        "w", (tuple(ready),), b, o, optimizer_s=opt, sync_s=sync, micro_batch_size=micro, **more
    )


def grpo(items: list[Item], w: Workload, **options) -> float:
    """The streaming mode's one step over these trajectories, drained per group."""
    rewards = (tuple(item.reward for item in items),)
    work = replace(w, ready_s=rewards, items=(tuple(items),), **options)
    (seconds,) = step_times(STREAMING, work)
    return seconds


def test_sync_waits_for_the_slowest_then_learns_everything():
    w = workload([1.0, 2.0, 9.0])
    assert step_times(SYNC, w) == [pytest.approx(9.0 + 3.0 + 0.75)]


def test_lazy_streaming_drains_what_has_arrived_and_reaches_the_bound_here():
    w = workload([1.0, 2.0, 9.0])
    # learner: 1..2 (first), 2..3 (second), idle, 9..10 (third): 10 + 0.75
    assert step_times(STREAMING, w) == [pytest.approx(10.75)]
    assert bound_step([1.0, 2.0, 9.0], w) == pytest.approx(10.75)


def test_a_pass_overhead_makes_eager_streaming_pay_per_trajectory():
    w = workload([1.0, 1.0, 1.0, 1.0], b=1.0, o=0.5)
    assert step_times(STREAMING, w) == [pytest.approx(1.0 + 0.5 + 4.0 + 0.75)]
    assert step_times(STREAMING, w, eager=True) == [pytest.approx(1.0 + 4 * 1.5 + 0.75)]


def test_streaming_closes_at_the_batchs_last_reward_after_its_work():
    """OPD and early start: the work's inputs (teacher scores, completions) come before the
    batch is complete; the step closes no earlier than its last reward."""
    w = workload([1.0, 2.0], gates_s=(6.0,))
    assert step_times(STREAMING, w) == [pytest.approx(6.0 + 0.75)]
    assert step_times(SYNC, w) == [pytest.approx(6.0 + 2.0 + 0.75)]


def test_async_overlaps_rollout_with_learning_at_bounded_staleness():
    w = Workload("w", ((2.0,), (2.0,), (2.0,), (2.0,)), 1.0, optimizer_s=0.0, sync_s=0.0)
    # k=1: batches 0 and 1 start at 0; batch n >= 2 starts when step n-2 is done:
    # steps end at 3, 4, 6 (batch 2 starts at 3), 7 (batch 3 starts at 4)
    assert mean_step_time(AsyncMode(1), w) == pytest.approx(7.0 / 4)
    assert mean_step_time(AsyncMode(1), w) < mean_step_time(SYNC, w)


def test_a_learner_bound_async_steps_at_its_learning_optimizer_and_weight_sync():
    """The trainer publishes the weights inside ``finish_step``, before it takes the next
    batch: a learner-bound async(2) steps every learn + optimizer + sync (1 + 0.5 + 0.25),
    whatever the rollout (ready at 0.1 s)."""
    w = Workload("w", ((0.1,),) * 8, 1.0, optimizer_s=0.5, sync_s=0.25)
    ends = [h[1] for h in _ends(AsyncMode(2), w)]
    assert [b - a for a, b in zip(ends[3:], ends[4:])] == [pytest.approx(1.75)] * 4


def _ends(mode, w):
    from harness.virtual_run import drive

    return [(h["submitted_at"], h["finished_at"]) for h in drive(mode, w)]


def test_rollout_slows_while_the_learner_computes_under_contention():
    """κ = 1: rollout runs at half speed while the learner computes. Items ready after 1 and
    3 s of rollout; the learner's pass over the first runs 1..2 s (1 s of work, 0.5 s of
    rollout), so the second falls due at 2 + (3 - 1.5) = 3.5 s: 3.5 + 1 + 0.75. Sync never
    overlaps its learner with rollout: 3 + 2 + 0.75 either way."""
    w = workload([1.0, 3.0], contention=1.0)
    assert step_times(STREAMING, w) == [pytest.approx(3.5 + 1.0 + 0.75)]
    assert step_times(SYNC, w) == step_times(SYNC, replace(w, contention=0.0))
    assert step_times(SYNC, w) == [pytest.approx(3.0 + 2.0 + 0.75)]


def test_the_learner_and_the_rollout_share_the_cores_by_their_loads():
    """ℓ = 0.6 and a rollout load of 0.6: while both compute, each runs 1.2 times slower.
    Items ready after 1 and 3 s of rollout; the pass over the first takes 1.2 s (1 .. 2.2),
    the rollout gets 1 s done meanwhile, so the second falls due at 3.2 and its pass, the
    rollout over, takes 1 s: 4.2 + 0.75. Loads that add to 0.9 slow no one; κ is not
    charged beside ℓ; and sync never overlaps the two."""
    w = workload([1.0, 3.0], loads=(((3.0, 0.6),),), learner_load=0.6, contention=5.0)
    assert step_times(STREAMING, w) == [pytest.approx(4.2 + 0.75)]
    assert step_times(STREAMING, replace(w, learner_load=0.3)) == [pytest.approx(4.0 + 0.75)]
    assert step_times(SYNC, w) == [pytest.approx(3.0 + 2.0 + 0.75)]


def test_async_s_learner_slows_beside_the_next_batchs_rollout():
    """async(1), each batch one item after 1 s of rollout at load 0.8, 1 s of learning at
    ℓ = 0.7. Batches 0 and 1 roll out together (1.6: both done at 1.6); step 0 learns alone
    (to 2.6), then each step learns beside the next batch's rollout, both 1.5 times slower:
    steps end at 2.6, 4.1, 5.6, ..., the last alone again (+1). Without ℓ the learner runs at
    full speed beside it: 2.6, 3.6, 4.6, ..."""
    w = Workload("w", ((1.0,),) * 6, 1.0, optimizer_s=0.0, sync_s=0.0, loads=(((1.0, 0.8),),) * 6)
    ends = [h[1] for h in _ends(AsyncMode(1), replace(w, learner_load=0.7))]
    assert ends == [pytest.approx(2.6 + 1.5 * n) for n in range(5)] + [pytest.approx(9.6)]
    assert [h[1] for h in _ends(AsyncMode(1), w)] == [pytest.approx(2.6 + n) for n in range(6)]


def test_a_pass_costs_its_micro_batches_padded_tokens():
    """Shortest first, two rows a micro-batch, each padded to its longest: (5, 10) and (20, 30)
    compute 2 x 10 + 2 x 30 tokens; o per micro-batch, f + g per backward per token. With room
    for eight rows the same two: 20 is more than twice 5."""
    w = Workload("w", (), 0.0, 0.01, micro_batch_size=2, forward_per_token_s=0.001)
    assert pass_seconds([30, 5, 20, 10], w) == pytest.approx(2 * 0.01 + 80 * 0.001)
    w = Workload("w", (), 0.0, 0.01, micro_batch_size=8, backward_per_token_s=0.0005)
    assert pass_seconds([30, 5, 20, 10], w, backwards=3) == pytest.approx(2 * 0.01 + 80 * 0.0015)
    # counted by trajectory (tokens unknown): o per micro-batch and b per row, as before
    assert pass_seconds([0] * 9, workload([0.0], b=1.0, o=0.5)) == pytest.approx(2 * 0.5 + 9)


def test_grpo_streaming_drains_deposits_finals_and_early_pieces_as_the_learner_does():
    """Group b's first two rewards (0.2 s) deposit together, 5 tokens each; at 1.0 s groups a
    and b close, and their four trajectories are one batch of finals in micro-batches of two,
    shortest first. With early start each trajectory is a piece of its own at its
    completion, and its reward costs nothing more."""
    w = Workload("w", (), 0.0, 0.01, 0.5, 0.25, micro_batch_size=2, forward_per_token_s=0.001)
    items = [Item(0.9, 1.0, "a", n) for n in (30, 10, 20)]
    items += [Item(0.1, 0.2, "b", 5), Item(0.1, 0.2, "b", 5), Item(0.9, 1.0, "b", 5)]
    # the deposit: 0.2 .. 0.22 (o + 2 x 5 tokens); the finals (5, 10) and (20, 30): 1.0 .. 1.1
    finals = 2 * 0.01 + (2 * 10 + 2 * 30) * 0.001
    assert grpo(items, w) == pytest.approx(1.0 + finals + 0.75)
    # early start: b's two at 0.1 (0.1 .. 0.13), then four pieces from 0.9: 0.9 .. 1.005
    pieces = 4 * 0.01 + (30 + 10 + 20 + 5) * 0.001
    assert grpo(items, w, early_start=True) == pytest.approx(0.9 + pieces + 0.75)
    # a KL term: the deposit's three backwards and a piece's two, per token
    kl = Workload("w", (), 0.0, 0.0, micro_batch_size=8, backward_per_token_s=0.001, kl=True)
    pair = [Item(0.0, 0.1, "g", 10), Item(0.0, 0.1, "g", 10), Item(0.0, 0.5, "g", 10)]
    # at 0.1 a deposit of two (2 x 10 x 3 backwards: 0.06), at 0.5 the last as final (0.01)
    assert grpo(pair, kl) == pytest.approx(0.5 + 0.01)
    # the last arrives during the deposit: final at 0.16
    assert grpo(pair[:2] + [Item(0.0, 0.12, "g", 10)], kl) == pytest.approx(0.1 + 0.06 + 0.01)
    # rewards that pass or fail: a deposit's two of one reward share a backward for Σ hᵢ and
    # Σ cᵢhᵢ (2 x 10 x 2 backwards: 0.04); of two rewards, a pass each (2 x 10 x 2: 0.04)
    for values in ((1.0, 1.0), (1.0, 0.0)):
        graded = [Item(0.0, 0.1, "g", 10, v) for v in values] + [Item(0.0, 0.12, "g", 10, 0.0)]
        assert grpo(graded, kl) == pytest.approx(0.1 + 0.04 + 0.01)


def test_a_drain_deposits_one_open_group_and_a_group_closed_meanwhile_takes_finals():
    """As the training loop's learner (thundersync.core.holds): at 0.1 s a's two rewards and
    b's first, all 0 (one backward and one for the KL term per deposit, 10 tokens each). b is
    further from closing and deposits first (0.1 .. 0.12); its last two rewards came at
    0.105, so it has closed: its two as finals (0.12 .. 0.14), before a's deposit; a's last
    came at 0.12, so a's three are finals too (0.14 .. 0.17). Depositing both groups at 0.1
    would have cost 0.06 and left three finals: 0.19."""
    kl = Workload("w", (), 0.0, 0.0, micro_batch_size=8, backward_per_token_s=0.001, kl=True)
    items = [Item(0.0, 0.1, "a", 10, 0.0), Item(0.0, 0.1, "a", 10, 0.0)]
    items += [Item(0.0, 0.12, "a", 10, 0.0), Item(0.0, 0.1, "b", 10, 0.0)]
    items += [Item(0.0, 0.105, "b", 10, 0.0), Item(0.0, 0.105, "b", 10, 0.0)]
    assert grpo(items, kl) == pytest.approx(0.17)


def test_early_starts_split_work_ends_at_its_first_half_where_the_reward_is_the_shift():
    """Split early start (docs/design.md §3): the three Σ hᵢ at 0 (30 ms); at 0.1 s the
    group's first reward, 0, is its shift c, so (rᵢ − c) hᵢ is 0 and costs nothing; at 0.2 s
    a reward of 1 costs its 10 ms; at 0.5 s the group closes on another 0: nothing more. Not
    knowing the rewards, each costs its pass and the step ends at 0.51 s."""
    w = Workload("w", (), 0.0, 0.0, micro_batch_size=8, backward_per_token_s=0.001)
    rewards = ((0.1, 0.0), (0.2, 1.0), (0.5, 0.0))
    known = [Item(0.0, t, "g", 10, v) for t, v in rewards]
    assert grpo(known, w, early_start=True, split=True) == pytest.approx(0.5)
    unknown = [Item(0.0, t, "g", 10) for t, _ in rewards]
    assert grpo(unknown, w, early_start=True, split=True) == pytest.approx(0.51)


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


def test_by_version_each_batch_is_the_one_its_policy_version_samples():
    """``Workload.by_version``: a batch rolls out what the policy the engine has at its
    submission samples (here version 0's batch ready at 1 s, version 1's at 3 s; learning 1 s).
    async(1) submits steps 0 and 1 with θ_0: both ready at 1 s, learned 1..2 and 2..3; step 2
    (submitted at 2 s with θ_1) ready at 5, learned 5..6; step 3 (at 3 s with θ_2, past the
    last batch: θ_1's) ready at 6, learned 6..7. Sync samples batch n with θ_n: identical."""
    from harness.virtual_run import drive

    w = Workload("w", ((1.0,), (3.0,)), 1.0, by_version=True)
    assert [h["finished_at"] for h in drive(AsyncMode(1), w, steps=4)] == [2.0, 3.0, 6.0, 7.0]
    assert step_times(SYNC, w) == step_times(SYNC, replace(w, by_version=False)) == [2.0, 4.0]


@pytest.mark.parametrize(
    ("share", "ends"), [(1.0, [5.0, 6.0, 9.0, 10.0]), (0.4, [3.0, 4.0, 6.0, 7.0])]
)
def test_batches_rolling_out_together_share_their_cores_by_load(share, ends):
    """async(1), every batch ready after 2 s of rollout, learned in 1 s. At a load of 1 the
    two batches in flight share the cores: batches 0 and 1 each run at half speed, both ready
    at 4 (steps end 5, 6); batch 2 (from 5) runs alone until batch 3 joins at 6, then both at
    half speed: ready at 8, learned 8..9; batch 3, at 1 s of 2 by then, alone: 9, learned
    9..10. At 0.4 their loads add to 0.8 and nothing slows (the case without loads). Sync
    never has two batches in flight: loads change nothing."""
    from harness.virtual_run import drive

    w = Workload("w", ((2.0,),) * 4, 1.0, loads=(((2.0, share),),) * 4)
    assert [h["finished_at"] for h in drive(AsyncMode(1), w)] == [pytest.approx(e) for e in ends]
    assert step_times(SYNC, w) == step_times(SYNC, replace(w, loads=())) == [3.0] * 4
