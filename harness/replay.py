"""A run replayed in its own mode from its own measurements: the simulator (its ``VirtualRun``
driven by the run's mode object) checked against a real run (docs/design.md §4)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.critical_path import (
    StepWindow,
    held_pieces,
    pass_cost,
    step_windows,
    token_pass_cost,
)
from harness.virtual_run import drive
from harness.workload import Item, Workload
from thundersync.core.micro_batches import chunk_shapes
from thundersync.training.modes import Mode, mode_from_label


def run_mode(folder: Path) -> tuple[Mode, dict[str, Any]]:
    """The mode object a run folder's ``config.json`` names, and the config."""
    config = json.loads((folder / "config.json").read_text())
    return mode_from_label(config["mode"], staleness=int(config.get("staleness", 1))), config


def relative(w: StepWindow, times: Sequence[float]) -> tuple[float, ...]:
    return tuple(t - w.submitted_at for t in times)


def items_of(w: StepWindow) -> tuple[Item, ...]:
    """The graded trajectories of step window ``w``, times from its batch's start."""
    return tuple(
        Item(
            (e.reward if e.completed is None else e.completed) - w.submitted_at,
            e.reward - w.submitted_at,
            e.group_id,
            e.tokens,
            e.value,
        )
        for e in w.episodes
        if e.reward is not None
    )


def step_time(history: Sequence[dict[str, Any]], mode: Mode) -> float:
    """A run's step time as the matrix measures it: one batch in flight, the median over steps
    of a batch's submission to its step's end; more (async, k + 1 in flight), its throughput
    once the pipeline is full (after step k + 1): the median over its windows of k + 1
    consecutive step intervals of their mean. A window as long as the pipeline holds one
    clump of batches that shared the cores and ended together; the median keeps one slow
    step (the learner's first steps; a generation call the machine stalled) from moving the
    figure, as sync's median does, where the mean interval of 6 steps moved 40 % with one
    (docs/measurements.md, 2026-12-07)."""
    skip = mode.batches_in_flight
    if skip > 1:
        ends = [h["finished_at"] for h in history][skip - 1 :]
        span = min(skip, len(ends) - 1)
        return statistics.median((ends[i + span] - ends[i]) / span for i in range(len(ends) - span))
    return statistics.median(h["finished_at"] - h["submitted_at"] for h in history)


def replay_run(folder: Path) -> dict[str, Any]:
    """The run's own mode object driven on a ``VirtualRun`` of the run's own ready times (rewards;
    completions with early start; teacher scores per turn for OPD, the batch closing at its last
    reward) and learner costs from its spans:

    - GRPO streaming: o, f and g fitted to its backward passes (``token_pass_cost``), each
      simulated pass charged by the padded tokens of the trajectories the drain puts in it
      (``harness/grpo_drain.py``), then its closing ``step``;
    - sync and async: the batch's learning (``learner.step()`` minus the optimizer) per padded
      token of its micro-batches (the median over steps), charged to each step's batch;
    - without the trajectories' lengths, and OPD's streaming (per-turn pieces): o and b per
      pass and item, fitted to its passes (``pass_cost``), or ``learner.step()`` per item.

    Every mode adds the measured intake before its step (``Workload.intake_s``). Both sides are
    measured alike (``step_time``); sync and streaming leave the first step, a warm-up, out."""
    mode, config = run_mode(folder)
    streams, skip = mode.learner_contract().streams, mode.batches_in_flight
    kl = float((config.get("objective") or {}).get("kl_coef", 0.0)) != 0.0
    every = step_windows(folder)
    if len(every) < skip + 2 or not all(w.work_times for w in every):
        raise ValueError(f"{folder}: needs at least {skip + 2} complete steps to replay")
    windows = every if skip > 1 else every[1:]
    opd = bool(every[0].teacher_times)
    early = streams and bool(config.get("early_start")) and not opd
    tokens = tuple(tuple(e.tokens for e in w.episodes) for w in windows)
    by_tokens = all(lengths and all(lengths) for lengths in tokens)
    micro = int(config.get("micro_batch_size", 8))
    o = b = f = g = fold = 0.0
    if streams and by_tokens and not opd:
        o, f, g = token_pass_cost(windows)
    elif streams:
        o, b = pass_cost(windows)
    if streams:
        fold = _median_span(windows, "step")
    elif by_tokens:
        f = statistics.median(
            w.learner_time_s / sum(rows * n for rows, n in chunk_shapes(lengths, micro))
            for w, lengths in zip(windows, tokens)
        )
    else:
        b = statistics.median(w.learner_time_s / len(w.work_times) for w in windows)
    ready = tuple(relative(w, w.completed_times if early else w.work_times) for w in windows)
    work = Workload(
        folder.name,
        ready,
        b,
        o,
        optimizer_s=0.0 if streams else _median_span(windows, "optimizer"),
        sync_s=_median_span(windows, "weight_publish"),
        micro_batch_size=micro,
        forward_per_token_s=f,
        backward_per_token_s=g,
        tokens=tokens if by_tokens else (),
        intake_s=intake(windows, streams=streams, pipelined=skip > 1, skip=skip),
        gates_s=tuple(max(relative(w, w.reward_times), default=0.0) for w in windows),
        items=tuple(items_of(w) for w in windows) if by_tokens and not opd else (),
        early_start=early,
        split=early and not held_pieces(folder, config),
        kl=kl,
        fold_s=fold,
    )
    predicted = step_time(drive(mode, work), mode)
    measured = step_time(
        [{"submitted_at": w.submitted_at, "finished_at": w.finished_at} for w in windows], mode
    )
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


def _median_span(windows: Sequence[StepWindow], name: str) -> float:
    return statistics.median(w.durations.get(name, 0.0) for w in windows)


def intake(
    windows: Sequence[StepWindow], *, streams: bool, pipelined: bool, skip: int = 0
) -> float:
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
