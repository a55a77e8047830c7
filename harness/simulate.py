"""``thundersync simulate``: the three modes' step times for a workload, without running a model.

A discrete-event model of one learner fed by one rollout batch per step (docs/design.md §4):
trajectory i's reward is ready cᵢ after its batch starts; a learner pass over micro-batches
(``micro_batch_size`` rows, shortest first, each padded to its longest row) costs, per
micro-batch, ``o`` + rows·``b`` + padded tokens·(``f`` + backwards·``g``) (``o`` the fixed cost
of a forward and its backwards, ``b`` a cost per trajectory, ``f`` and ``g`` the forward's and
each backward's cost per padded token: a named workload charges by trajectory, o + k·b, a
replayed GRPO run by padded tokens); then the optimizer and the weight sync.

- sync: T = max cᵢ + passes of the whole batch + optimizer + sync (replaying a run, the
  learner starts no earlier than the batch is complete: every reward in, which for OPD, whose
  cᵢ are teacher scores per turn, comes after the last score).
- streaming (lazy drain): whenever the learner is free it takes everything that has arrived
  as one micro-batch; eager: one pass per trajectory. A replayed GRPO run drains as
  ``StreamingGRPO`` does (``grpo_streaming_step``): per open group a batched deposit of its
  rewarded trajectories (a lone one: its own piece), the trajectories of closed groups as one
  batch of finals, and with early start a piece per trajectory that completed unrewarded.
- async(k): batch n starts when the weights of step n−k−1 exist; the learner takes batch n
  when it is complete; the step time is the learner's throughput.
- T*: max_k (c₍ₖ₎ + Σ_{j≥k} b) + optimizer + sync, the bound of any zero-staleness schedule.

A workload is named (``long-tail``, ``balanced``, ``agentic``) or read from a run folder (its
reward-ready times per step, and b, o, optimizer and sync from its spans), so a prediction can
be checked against a measured run (``replay_run``, which ``benchmarks/matrix.py`` prints for
every cell); ``--project FILE`` projects a cluster from stated inputs
(``harness/projection.py``).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.critical_path import (
    batched_cost_per_trajectory,
    held_pieces,
    pass_cost,
    step_windows,
    token_pass_cost,
)
from thundersync.core.micro_batches import chunk_shapes, weight_classes
from thundersync.training.modes import REGISTRY, Mode, mode_from_label


@dataclass(frozen=True, slots=True)
class Workload:
    """One learner's view of training: per step, when each trajectory's reward is ready."""

    name: str
    ready_s: tuple[tuple[float, ...], ...]
    """Per step, the reward-ready times of its trajectories (from the batch's start)."""
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
    """A measured run's workload: its reward-ready times per step; b and o from a sync run's
    learner spans (``sync_folder``, or the run itself when it is a sync run)."""
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


def replay_run(folder: Path) -> dict[str, Any]:
    """A run replayed in its own mode from its own measurements, beside the step time it
    measured: the simulator checked against a real run. Each step's ready times (rewards;
    completions with early start; teacher scores per turn for OPD); the learner's costs from
    its spans, charged to the schedule the simulator makes itself:

    - GRPO streaming: o, f and g fitted to its backward passes (``token_pass_cost``), each
      simulated pass charged by the padded tokens of the trajectories the drain puts in it
      (``grpo_streaming_step``), then its closing ``step``;
    - sync and async: the batch's learning (``learner.step()`` minus the optimizer) per padded
      token of its micro-batches (the median over steps), charged to each step's batch;
    - without the trajectories' lengths, and OPD's streaming (per-turn pieces): o and b per
      pass and item, fitted to its passes (``pass_cost``), or ``learner.step()`` per item.

    Every mode adds the measured intake before its step (``Workload.intake_s``). Sync and
    streaming: the median over steps (the first, a warm-up, left out) of a step's time from
    its batch's submission to its end; async: the mean interval between step ends once the
    pipeline is full (after step k+1), its throughput."""
    config = json.loads((folder / "config.json").read_text())
    mode = mode_from_label(config["mode"], staleness=int(config.get("staleness", 1)))
    streams, pipelined = _schedule(mode)
    kl = float((config.get("objective") or {}).get("kl_coef", 0.0)) != 0.0
    every = step_windows(folder)
    # pipelined (async): the steady state comes after the pipeline's fill (steps 1..k+1)
    skip = mode.batches_in_flight
    if len(every) < skip + 2 or not all(w.work_times for w in every):
        raise ValueError(f"{folder}: needs at least {skip + 2} complete steps to replay")
    windows = every if pipelined else every[1:]
    opd = bool(every[0].teacher_times)
    early = streams and bool(config.get("early_start")) and not opd
    split = early and not held_pieces(folder, config)

    def relative(w: Any, times: Sequence[float]) -> tuple[float, ...]:
        return tuple(t - w.submitted_at for t in times)

    ready = tuple(relative(w, w.completed_times if early else w.work_times) for w in windows)
    # the batch's trajectories by length (0: unknown), what sync and async learn at the step
    tokens = tuple(tuple(e.tokens for e in w.episodes) for w in windows)
    by_tokens = all(lengths and all(lengths) for lengths in tokens)
    micro_batch_size = int(config.get("micro_batch_size", 8))
    publish = statistics.median(w.durations.get("weight_publish", 0.0) for w in windows)
    o = b = f = g = 0.0
    if streams:
        if by_tokens and not opd:
            o, f, g = token_pass_cost(windows)
        else:
            o, b = pass_cost(windows)
        closing = statistics.median(w.durations.get("step", 0.0) for w in windows)
    else:
        if by_tokens:
            f = statistics.median(
                w.learner_time_s
                / sum(rows * n for rows, n in chunk_shapes(lengths, micro_batch_size))
                for w, lengths in zip(windows, tokens)
            )
        else:
            b = statistics.median(w.learner_time_s / len(w.work_times) for w in windows)
        closing = statistics.median(w.durations.get("optimizer", 0.0) for w in windows)
    work = Workload(
        folder.name,
        ready,
        b,
        o,
        optimizer_s=closing,
        sync_s=publish,
        micro_batch_size=micro_batch_size,
        forward_per_token_s=f,
        backward_per_token_s=g,
        tokens=tokens if by_tokens else (),
        intake_s=intake(windows, streams=streams, pipelined=pipelined, skip=skip),
    )
    if pipelined:
        done = async_schedule(work, mode.batches_in_flight - 1)
        predicted = (done[-1] - done[skip - 1]) / (len(done) - skip)
        measured = (every[-1].finished_at - every[skip - 1].finished_at) / (len(every) - skip)
    else:
        # a step closes once its batch is complete, every reward in: after the work's inputs
        # with early start (completions) and OPD (teacher scores per turn)
        gates = [max(relative(w, w.reward_times), default=0.0) for w in windows]
        if not streams:
            steps = [sync_step(r, work, gate=g, tokens=n) for r, g, n in zip(ready, gates, tokens)]
        elif by_tokens and not opd:
            steps = [
                grpo_streaming_step(
                    _items(w), work, early_start=early, split=split, kl=kl, gate=gate
                )
                for w, gate in zip(windows, gates)
            ]
        else:
            steps = [streaming_step(r, work, gate=g) for r, g in zip(ready, gates)]
        predicted = statistics.median(steps)
        measured = statistics.median(w.time_s for w in windows)
    lone = 1 + int(kl)  # a lone trajectory's backwards: ∇ℓ, and ∇ of the KL term
    mean_tokens = statistics.mean(n for lengths in tokens for n in lengths) if by_tokens else 0
    return {
        "run": folder.name,
        "mode": mode.label,
        "early_start": early,
        "predicted_step_time_s": predicted,
        "measured_step_time_s": measured,
        "error": predicted / measured - 1.0,
        # a lone trajectory of the run's mean length costs o + this (sync, async: the
        # batched learning per trajectory)
        "cost_per_item_s": (
            b + mean_tokens * (f + lone * g)
            if streams
            else statistics.median(w.learner_time_s / len(w.work_times) for w in windows)
        ),
        "pass_overhead_s": o,
        "forward_per_token_s": f,
        "backward_per_token_s": g,
        "intake_s": work.intake_s,
    }


def _items(w: Any) -> list[Item]:
    """The graded trajectories of step window ``w``, times from its batch's start."""
    return [
        Item(
            (e.reward if e.completed is None else e.completed) - w.submitted_at,
            e.reward - w.submitted_at,
            e.group_id,
            e.tokens,
            e.value,
        )
        for e in w.episodes
        if e.reward is not None
    ]


def _schedule(mode: Mode) -> tuple[bool, bool]:
    """What the simulator models of a mode, asked of the mode object (no name compared): does
    its learner work on each item as it is ready (streaming's contract), and do later batches
    roll out while it learns (async: more than one batch in flight)."""
    return mode.learner_contract().streams, mode.batches_in_flight > 1


def intake(windows: Sequence[Any], *, streams: bool, pipelined: bool, skip: int = 0) -> float:
    """The learner's wait between having its inputs and starting its ``step`` span (no span
    covers it): the trainer routing the events that arrived (to the logs, the batch's
    tracker) and the learner consuming them. Sync: from the last reward; streaming: from the
    last reward or the end of the last backward pass, whichever is later; async: from the
    last reward or the previous step's end, the mean over the steady state (steps after
    ``skip``): there the events of the next batches queue while the learner steps, and one
    intake may take in two batches, then none (async(2) alternates, 60 ms and 5 ms)."""
    gaps = []
    previous_end = None
    for w in windows:
        inputs = max(w.reward_times, default=w.submitted_at)
        if streams and w.passes:
            inputs = max(inputs, max(p.started + p.seconds for p in w.passes))
        if pipelined and previous_end is not None:
            inputs = max(inputs, previous_end)
        if w.step_started is not None:
            gaps.append(max(w.step_started - inputs, 0.0))
        previous_end = w.finished_at
    if pipelined:
        steady = gaps[skip:] if len(gaps) > skip else gaps
        return statistics.mean(steady) if steady else 0.0
    return statistics.median(gaps) if gaps else 0.0


def _passes(k: int, w: Workload) -> float:
    return pass_seconds((0,) * k, w)


def sync_step(
    ready: Sequence[float], w: Workload, *, gate: float = 0.0, tokens: Sequence[int] = ()
) -> float:
    """Sync's step: the whole batch learned once it is complete (``gate``: its last reward,
    where the work's inputs come earlier, as OPD's teacher scores do); ``tokens``, its
    trajectories' lengths when the learner is charged by padded tokens."""
    learn = pass_seconds(tokens, w) if tokens else _passes(len(ready), w)
    return max(max(ready), gate) + w.intake_s + learn + w.optimizer_s + w.sync_s


def streaming_step(
    ready: Sequence[float], w: Workload, *, eager: bool = False, gate: float = 0.0
) -> float:
    """Streaming's step: the learner drains what has arrived (``eager``: one item per pass);
    the step closes no earlier than ``gate`` (with early start, the last reward)."""
    arrivals, t, i = sorted(ready), 0.0, 0
    while i < len(arrivals):
        t = max(t, arrivals[i])
        k = 1 if eager else sum(1 for a in arrivals[i:] if a <= t)
        t += _passes(k, w)
        i += k
    return max(t, gate) + w.intake_s + w.optimizer_s + w.sync_s


def grpo_streaming_step(
    items: Sequence[Item],
    w: Workload,
    *,
    early_start: bool = False,
    split: bool = False,
    kl: bool = False,
    gate: float = 0.0,
) -> float:
    """Streaming GRPO's step, its learner draining as ``StreamingGRPO.drain`` does whenever
    it is free: of everything that has arrived, the trajectories of closed groups (every
    reward in) as one batch of finals (one backward per micro-batch), the rewarded ones of
    each open group as one deposit (``micro_batches.weight_classes``: those whose reward is the
    group's shift c, the first reward it deposited, and the rest, each a backward for Σ hᵢ
    and Σ cᵢhᵢ where its rewards are one, else a backward per sum; and one for Σ kᵢ with a KL
    term; a lone one, its own piece), and with ``early_start`` a piece of its own for each
    completed trajectory without a reward yet (whose reward then costs nothing more), or with
    ``split`` (early start within two buffers per open group: docs/design.md §3) each open
    group's completed ones as one pass of Σ hᵢ (and Σ kᵢ), their rewards' halves (none where
    the reward is c) then a backward each per group, or once the group closes one batch with
    the finals' (none in a group of equal rewards). Each pass is charged by its trajectories'
    padded tokens (``pass_seconds``), so a closing batch of the longest episodes costs what
    its rows × length do. ``kl``: the objective has a KL term (one more backward per piece and
    deposit)."""
    closes: dict[str, float] = {}
    values: dict[str, set[float | None]] = {}
    for item in items:
        closes[item.group] = max(closes.get(item.group, item.reward), item.reward)
        values.setdefault(item.group, set()).add(item.value)
    equal = {g for g, v in values.items() if len(v) == 1 and None not in v}  # no advantage
    pieces: set[int] = set()
    halves: set[int] = set()
    left = set(range(len(items)))

    def wakes(i: int) -> float:
        """When trajectory i next has work: its reward (or with early start, unless its
        piece or first half is done, its completion)."""
        item = items[i]
        started = i in pieces or i in halves
        return item.completed if early_start and not started else item.reward

    ref = 1 + int(kl)  # forwards of a pass that computes the KL term: the reference's too

    def passes(groups: Iterable[list[int]], backwards: int, forwards: int) -> float:
        """One pass per group of item indices."""
        return sum(
            pass_seconds([items[i].tokens for i in g], w, backwards=backwards, forwards=forwards)
            for g in groups
        )

    shifts: dict[str, float | None] = {}  # a group's c: its first reward deposited

    def weight(i: int) -> float | None:
        """rᵢ − c (None: unknown)."""
        value, shift = items[i].value, shifts.get(items[i].group, 0.0)
        return None if value is None or shift is None else value - shift

    def weighted(group: Iterable[int]) -> list[int]:
        """The split items whose (rᵢ − c) hᵢ is not known to be 0."""
        return [i for i in group if weight(i) != 0.0]

    t = 0.0
    while left:
        now = t = max(t, min(wakes(i) for i in left))
        finals: list[int] = []
        remainders: list[int] = []
        deposits: dict[str, list[int]] = {}
        seconds: dict[str, list[int]] = {}
        firsts: dict[str, list[int]] = {}
        for i in sorted(left, key=wakes):
            if wakes(i) > now:
                continue
            item = items[i]
            if i in pieces:  # its piece is added, scaled once the group closes: no pass
                left.discard(i)
            elif closes[item.group] <= now:
                (remainders if i in halves else finals).append(i)
            elif item.reward <= now:
                (seconds if i in halves else deposits).setdefault(item.group, []).append(i)
            elif split:
                firsts.setdefault(item.group, []).append(i)
            else:  # early start: its piece now, in the drain's loop
                t += pass_seconds([item.tokens], w, backwards=1 + int(kl), forwards=ref)
                pieces.add(i)
        for gid, group in [*seconds.items(), *deposits.items()]:
            shifts.setdefault(gid, items[min(group, key=wakes)].value)
        for group in deposits.values():  # a lone one: its piece, one backward (and kᵢ)
            weights = [weight(i) for i in group]
            classes = weight_classes(weights) if len(group) > 1 else [([0], 0.0)]
            for indices, shared in classes:
                members = [group[k] for k in indices]
                t += passes([members], (1 if shared is not None else 2) + int(kl), ref)
            left.difference_update(group)
        t += passes(map(weighted, seconds.values()), 1, 1)
        t += passes(firsts.values(), 1 + int(kl), ref)
        for group in seconds.values():
            left.difference_update(group)
        for group in firsts.values():
            halves.update(group)
        left.difference_update(remainders)
        rest = weighted(i for i in remainders if items[i].group not in equal)
        for batch, forwards in ((rest, 1), (finals, ref)):
            if batch:
                t += passes([batch], 1, forwards)
                left.difference_update(batch)
    return max(t, gate) + w.intake_s + w.optimizer_s + w.sync_s


def bound_step(ready: Sequence[float], w: Workload) -> float:
    arrivals, b = sorted(ready), w.cost_per_trajectory_s
    n = len(arrivals)
    tail = max(c + (n - k) * b for k, c in enumerate(arrivals))
    return tail + w.optimizer_s + w.sync_s


def async_schedule(w: Workload, staleness: int) -> list[float]:
    """When each step of async(k) ends: batches 0..k start at once, batch n once step
    n−k−1's weights exist (``modes/async_.py``); the learner takes a batch when it is
    complete."""
    done: list[float] = []  # learner finish time of each step
    learner_free = 0.0
    for n, ready in enumerate(w.ready_s):
        start = done[n - staleness - 1] if n - staleness - 1 >= 0 else 0.0
        available = start + max(ready)
        learn = pass_seconds(w.tokens[n], w) if w.tokens else _passes(len(ready), w)
        learner_free = max(learner_free, available) + w.intake_s + learn + w.optimizer_s
        done.append(learner_free + w.sync_s)
    return done


def async_steps(w: Workload, staleness: int) -> float:
    """Mean step time of async(k), the pipeline's filling included."""
    done = async_schedule(w, staleness)
    return done[-1] / len(done)


def simulate(w: Workload, *, staleness: int = 1) -> dict[str, Any]:
    """Every registered mode's mean step time on ``w`` (async with ``staleness``), keyed by
    its label; a streaming mode's eager drain too (``<label>-eager``), and the bound T*."""
    mean = statistics.mean
    bound = [bound_step(r, w) for r in w.ready_s]
    times: dict[str, float] = {}
    efficiency: dict[str, float] = {}
    baseline = ""
    for cls in REGISTRY:
        mode = cls.from_label(cls.name, staleness=staleness)
        assert mode is not None  # a mode's own name is one of its labels
        streams, pipelined = _schedule(mode)
        baseline = mode.label if mode.baseline else baseline
        if pipelined:
            times[mode.label] = async_steps(w, mode.batches_in_flight - 1)
        elif not streams:
            times[mode.label] = mean(sync_step(r, w) for r in w.ready_s)
        else:
            for label, eager in ((mode.label, False), (f"{mode.label}-eager", True)):
                steps = [streaming_step(r, w, eager=eager) for r in w.ready_s]
                times[label] = mean(steps)
                efficiency[label] = mean(b / t for b, t in zip(bound, steps))
    times["bound"] = mean(bound)
    result: dict[str, Any] = {
        "workload": w.name,
        "steps": len(w.ready_s),
        "step_time_s": times,
        "efficiency": efficiency,
        **w.notes,
    }
    result["speedup_vs_sync"] = {k: times[baseline] / v for k, v in times.items() if k != "bound"}
    return result
