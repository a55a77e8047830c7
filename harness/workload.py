"""What the simulator charges (docs/design.md §4): per step, when each piece of learner work has
its inputs, and what the learner's passes, optimizer and weight sync cost."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.critical_path import batched_cost_per_trajectory, step_windows
from thundersync.core.micro_batches import chunk_shapes


@dataclass(frozen=True, slots=True)
class Item:
    """One GRPO trajectory of a step as the streaming learner sees it (seconds from the
    batch's start)."""

    completed: float
    """Its last action fixed: with early start its piece may start."""
    reward: float
    group: str
    """Its group closes, and its advantages are final, at the group's last reward."""
    tokens: int = 0
    value: float | None = None
    """Its reward (None: unknown, and a deposit's weights taken to differ): a deposit's
    trajectories of one reward share their backward (``micro_batches.weight_classes``); where
    it is its group's shift c, its split work ends at its first half."""


@dataclass(frozen=True, slots=True)
class Workload:
    """One learner's view of training: per step, when each piece of work is ready, and the
    learner's costs. Times of a step are seconds of rollout from its batch's start."""

    name: str
    ready_s: tuple[tuple[float, ...], ...]
    """Per step, when each work item has its inputs (a reward; an OPD turn's teacher score)."""
    cost_per_trajectory_s: float
    """b: batched learner time per trajectory."""
    pass_overhead_s: float = 0.0
    """o: fixed cost of each micro-batch of a learner pass (a lone trajectory costs o + b)."""
    optimizer_s: float = 0.0
    sync_s: float = 0.0
    micro_batch_size: int = 8
    notes: dict[str, Any] = field(default_factory=dict)
    forward_per_token_s: float = 0.0
    """f: a pass's forward per padded token (rows × a micro-batch's longest row)."""
    backward_per_token_s: float = 0.0
    """g: each backward of a pass per padded token."""
    tokens: tuple[tuple[int, ...], ...] = ()
    """Per step, its trajectories' lengths in tokens (what sync and async learn in one batch of
    micro-batches); empty: every trajectory counts as 0 tokens (o and b alone)."""
    intake_s: float = 0.0
    """The learner's time from its inputs being in (the batch complete, the last pass done) to
    the start of its step, measured in a run: the trainer taking in the events that queued
    while it learned (async, where that queue is a whole batch) and consuming them."""
    gates_s: tuple[float, ...] = ()
    """Per step, when the batch is complete (its last reward), where that is later than its
    last work item (OPD's teacher scores; early start's completions); empty: the last item."""
    items: tuple[tuple[Item, ...], ...] = ()
    """Per step, its GRPO trajectories: a streaming learner then drains them per group as
    ``StreamingGRPO`` does (``harness/grpo_drain.py``) instead of one pass of what arrived."""
    early_start: bool = False
    """A streaming learner's GRPO pieces start at completion (``Learner(early_start=True)``)."""
    split: bool = False
    """Early start within two buffers per open group: the work split (docs/design.md §3)."""
    kl: bool = False
    """The objective has a KL term: one more forward and backward per piece and deposit."""
    batch_forwards: int = 1
    """Forwards per micro-batch of a batched pass at ``step()`` (sync, async)."""
    fold_s: float = 0.0
    """A streaming learner's ``step()`` beyond the optimizer: folding the groups' sums."""
    contention: float = 0.0
    """κ: while the learner computes, rollout runs 1 + κ times slower (the engine, tools and
    graders share the learner's cores); 0: they do not compete."""
    loads: tuple[tuple[tuple[float, float], ...], ...] = ()
    """Per batch, its rollout's load on the rollout's cores (``harness.contention.Load``):
    batches in flight together whose shares add past 1 slow each other in proportion
    (processor sharing); empty: they never do."""
    learner_load: float | None = None
    """ℓ: the learner's share of the rollout's cores while it computes alone. Given with
    ``loads``, the learner and the batches rolling out share those cores (processor sharing:
    where ℓ and their loads add past 1, each runs that many times slower) in place of κ;
    None: κ (docs/design.md §4)."""
    by_version: bool = False
    """Step n rolls out the batch of the policy the engine has when it is submitted (batch v
    after v optimizer steps, the last batch past the end) rather than batch n: a run's batches
    as another mode would sample them (async(k) samples batch n with θ_{n−k}: early in
    training, shorter episodes than sync's batch n)."""

    def gate(self, step: int) -> float:
        """When batch ``step`` is complete, from its start."""
        last = max(self.ready_s[step], default=0.0)
        return max(last, self.gates_s[step]) if self.gates_s else last


def pass_seconds(
    tokens: Sequence[int], w: Workload, *, backwards: int = 1, forwards: int = 1
) -> float:
    """One learner pass over trajectories of these lengths: per micro-batch o, b per row and
    (forwards·f + backwards·g) per padded token (a padded forward computes every row to the
    longest)."""
    per_token = forwards * w.forward_per_token_s + backwards * w.backward_per_token_s
    return sum(
        w.pass_overhead_s + rows * w.cost_per_trajectory_s + rows * longest * per_token
        for rows, longest in chunk_shapes(tokens, w.micro_batch_size)
    )


def batch_seconds(w: Workload, step: int) -> float:
    """The batched pass over step ``step``'s trajectories (sync and async at ``step()``)."""
    tokens = w.tokens[step] if w.tokens else (0,) * len(w.ready_s[step])
    return pass_seconds(tokens, w, forwards=w.batch_forwards)


def named_workload(name: str, *, steps: int = 20, seed: int = 0) -> Workload:
    """``long-tail`` (32 log-normal completions, median 2 s, σ 1; batched learner time about
    half the makespan), ``balanced`` (σ 0.5; learner time about the makespan), ``agentic``
    (64 episodes of minutes, σ 1.2; learner about half the makespan). The fixed cost of a
    learner pass is a fifth of a trajectory's (a lone backward costs 1.2× its batched share,
    as measured on CPU; docs/design.md §4)."""
    presets = {
        "long-tail": (32, 2.0, 1.0, 0.25, 0.05),
        "balanced": (32, 2.0, 0.5, 0.18, 0.04),
        "agentic": (64, 120.0, 1.2, 11.0, 2.0),
    }
    if name not in presets:
        raise ValueError(
            f"unknown workload {name!r}; expected one of {sorted(presets)} or a run folder"
        )
    n, median, sigma, b, o = presets[name]
    rng = random.Random(seed)
    ready = tuple(
        tuple(median * math.exp(sigma * rng.gauss(0, 1)) for _ in range(n)) for _ in range(steps)
    )
    return Workload(name, ready, b, o, optimizer_s=b * 2, sync_s=b)


def run_workload(folder: Path, sync_folder: Path | None = None) -> Workload:
    """A measured run's workload as ``simulate --workload RUN`` has read it: its reward-ready
    times per step; b from a sync run's learner spans (``sync_folder``, or the run itself)."""
    windows = step_windows(folder)
    b = batched_cost_per_trajectory(sync_folder or folder)
    ready = tuple(tuple(t - w.submitted_at for t in w.reward_times) for w in windows)
    opt = statistics.median(w.durations.get("optimizer", 0.0) for w in windows)
    sync = statistics.median(w.durations.get("weight_publish", 0.0) for w in windows)
    measured = [w.time_s for w in windows]
    return Workload(
        folder.name,
        ready,
        b,
        0.0,
        optimizer_s=opt,
        sync_s=sync,
        notes={"measured_step_time_s": statistics.median(measured)},
    )
