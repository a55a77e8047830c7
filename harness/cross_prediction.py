"""Every registered mode predicted from one run of any mode (``thundersync simulate --from RUN``;
docs/design.md §4): the run's ready times and learner costs, fitted from its own spans, drive
each mode object on a ``VirtualRun``.

What one mode's run says about another's:

- **Ready times** (each trajectory's completion and reward, from its batch's start) are the
  run's own, batch by batch, each the batch its policy version sampled (``by_version``:
  async(k) rolls out version n − k's batch at step n). They were measured under the run's own
  contention: where its learner computed while the batch rolled out (streaming; async), the
  rollout ran slower (the engine, the tools and the graders share the learner's cores). Each
  time is turned back into uncontended rollout seconds, t − κ/(1+κ)·(learner busy before t),
  and every predicted mode pays κ again wherever its learner overlaps its rollout
  (``VirtualRun.advance``).
- **Loads**: how busy each batch kept the rollout's cores while the learner idled
  (``contention.rollout_sharing``, from ``cpu_load``'s readings): a mode that rolls batches
  out together (async) has them share those cores where their loads add past 1. From an
  async run, whose batches shared the cores, each time is also taken back to what it would
  have been alone: a full reading of m batches had each lose 1 − 1/(m · its share alone),
  that share measured where one batch rolled out alone (a guess of 1 where none did). A run
  recorded before the readings existed predicts batches sharing nothing.
- **κ** is fitted from the engine's generation spans: how much slower generation batches ran
  beside the learner than alone, their batch sizes accounted for
  (``contention.generation_slowdown``), times the engine's share of the rollout's time. A run
  whose learner never overlapped its rollout (sync) cannot show κ: there the learner's own
  load ℓ is read instead (the readings inside its work, nothing rolling out), and the
  predicted learner and batches share the rollout's cores by their loads, each slowed where
  they add past 1 (``Workload.learner_load``): async's learner, beside a rollout, slows too.
  Without readings κ is 0 unless given (``contention``), and said so.
- **Learner costs**: a run with backward passes (streaming) gives o and f, with g = 2f
  (``tied_pass_cost``: its small passes cannot tell f from g), and a batched pass is charged
  as a padded pass of one backward; a run
  that learns at ``step()`` (sync, async) gives a cost per padded token (the median over its
  steps; no fixed cost per pass), split into a forward and a backward as 1 : 2 (a backward
  costs about two forwards) to charge streaming's deposits and pieces.
- **Time to the target**: the exact modes take the same updates, so they reach a target at
  the same step; the predicted time is when each mode ends that step. Async's updates differ
  (stale), so its time is to the same step, labelled as such.

What it cannot know: async's trajectories come from a policy trained on stale tokens, and they
differ from the run's beyond the version lag (on ToySum its episodes stay shorter), so async
predicted from a sync or streaming run is a prediction for the run's own trajectories.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.contention import (
    Contention,
    fit_contention,
    learner_busy,
    rollout_sharing,
    uncontended,
)
from harness.critical_path import (
    LearnerPass,
    StepWindow,
    held_pieces,
    nonnegative_least_squares,
    step_windows,
    token_pass_cost,
)
from harness.replay import intake, items_of, run_mode, step_time
from harness.simulate import registered_modes
from harness.virtual_run import drive
from harness.workload import Item, Workload
from thundersync.core.micro_batches import chunk_shapes


@dataclass(frozen=True, slots=True)
class LearnerCosts:
    """The learner's costs, fitted from one run (``Workload``'s o, f, g and closing costs)."""

    pass_overhead_s: float
    forward_per_token_s: float
    backward_per_token_s: float
    optimizer_s: float
    fold_s: float
    source: str
    """``passes`` (fitted to its backward passes) or ``batched`` (to its ``step()``s)."""


def learner_costs(
    windows: Sequence[StepWindow], *, streams: bool, kl: bool, micro: int
) -> LearnerCosts:
    """o, f and g from the run's passes, or from its batched steps (module docstring)."""
    optimizer = statistics.median(w.durations.get("optimizer", 0.0) for w in windows)
    if streams:
        token_pass_cost(list(windows))  # refuses passes it cannot fit, saying why
        o, f = tied_pass_cost([p for w in windows for p in w.passes])
        step = statistics.median(w.durations.get("step", 0.0) for w in windows)
        return LearnerCosts(o, f, 2 * f, optimizer, max(step - optimizer, 0.0), "passes")
    # per padded token; a pass's fixed cost o is not told apart from its tokens' within the
    # noise of a few steps of ~8 micro-batches each (a fit put a fifth of a second on o)
    per_token = statistics.median(
        w.learner_time_s
        / sum(r * n for r, n in chunk_shapes([e.tokens for e in w.episodes], micro))
        for w in windows
    )
    ref = 1 + int(kl)  # a batched pass's forwards: the policy's, and the reference's
    f = per_token / (ref + 2)
    return LearnerCosts(0.0, f, 2 * f, optimizer, 0.0, "batched")


def tied_pass_cost(passes: Sequence[LearnerPass]) -> tuple[float, float]:
    """(o, f) with a backward costing two forwards: seconds = o · micro-batches + padded
    tokens · (forwards + 2 · backwards) · f, none negative. A streaming run's passes are small
    and each one's forwards grow with its backwards, so ``token_pass_cost``'s free f and g are
    nearly collinear: on the demo it put f at several times g, which charged sync's one
    batched pass (one forward per backward) 1.3–1.5 times what it took (docs/measurements.md,
    2026-12-05 night); tied, the batched pass predicted from streaming's passes came within
    0.99–1.07 of sync's own over six seeds."""
    rows = [
        (float(p.padded_tokens * (p.forwards + 2 * p.backwards)), float(p.micro_batches))
        for p in passes
    ]
    f, o = nonnegative_least_squares(rows, [p.seconds for p in passes])
    return o, f


def fitted_workload(
    folder: Path,
    *,
    contention: float | None = None,
    early_start: bool | None = None,
    costs_from: Path | None = None,
) -> tuple[Workload, Contention, LearnerCosts]:
    """The run's batches (uncontended ready times, one per policy version: what any mode
    samples with that version, ``Workload.by_version``) and learner costs (its first step, a
    warm-up, left out) as a ``Workload``; a streaming learner with ``early_start`` (None: as
    the run's config says); the learner's costs from ``costs_from``'s spans where given."""
    mode, config = run_mode(folder)
    streams, skip = mode.learner_contract().streams, mode.batches_in_flight
    every = step_windows(folder)
    windows = every[1:]
    if len(windows) < 2 or not all(w.episodes and all(e.tokens for e in w.episodes) for w in every):
        raise ValueError(
            f"{folder}: needs at least 3 complete steps whose trajectories' lengths "
            "events.jsonl records (a GRPO run) to predict other modes from"
        )
    if any(w.teacher_times for w in windows):
        raise ValueError(f"{folder}: an OPD run; --from predicts GRPO runs only")
    kl = float((config.get("objective") or {}).get("kl_coef", 0.0)) != 0.0
    micro = int(config.get("micro_batch_size", 8))
    busy = learner_busy(folder)
    kappa = fit_contention(folder, windows, busy, contention)
    costs = learner_costs(windows, streams=streams, kl=kl, micro=micro)
    if costs_from is not None:
        other, _ = run_mode(costs_from)
        measured = step_windows(costs_from)[1:]
        streamed = other.learner_contract().streams
        costs = learner_costs(measured, streams=streamed, kl=kl, micro=micro)

    sharing = rollout_sharing(folder, every, busy)

    def clean(w: StepWindow, t: float) -> float:
        at, start = t + w.submitted_at, w.submitted_at
        return uncontended(at, start, busy, kappa.kappa) - sharing.lost(start, at)

    # async(k) sampled batches 0..k with θ_0 and batch n with θ_{n-k}
    versions = [every[0], *every[skip:]]
    items = tuple(
        tuple(
            Item(clean(w, i.completed), clean(w, i.reward), i.group, i.tokens, i.value)
            for i in items_of(w)
        )
        for w in versions
    )
    early = bool(config.get("early_start")) if early_start is None else early_start
    work = Workload(
        folder.name,
        tuple(tuple(i.reward for i in batch) for batch in items),
        0.0,
        costs.pass_overhead_s,
        optimizer_s=costs.optimizer_s,
        sync_s=statistics.median(w.durations.get("weight_publish", 0.0) for w in windows),
        micro_batch_size=micro,
        forward_per_token_s=costs.forward_per_token_s,
        backward_per_token_s=costs.backward_per_token_s,
        tokens=tuple(tuple(i.tokens for i in batch) for batch in items),
        intake_s=intake(windows, streams=streams, pipelined=skip > 1, skip=skip),
        items=items,
        early_start=early,
        split=early and not held_pieces(folder, config),
        kl=kl,
        batch_forwards=1 + int(kl),
        fold_s=costs.fold_s,
        contention=kappa.kappa,
        loads=sharing.loads(versions, clean),
        # a run that shows no κ (sync's learner never overlaps its rollout) shows the
        # learner's own load instead: the learner and the rollout then share the cores
        learner_load=sharing.learner if contention is None and not kappa.measured else None,
        by_version=True,
    )
    return work, kappa, costs


def target_step(folder: Path, target: float) -> int | None:
    """The first evaluated step at which the run reached ``target``, from the comparison's
    ``results.json`` two folders up (``compare``'s ``runs/<mode>-seed<N>/``); None: no such
    file, or the run never reached it."""
    results = folder.resolve().parent.parent / "results.json"
    if not results.is_file():
        return None
    for run in json.loads(results.read_text()).get("runs", []):
        if Path(run.get("folder", "")).resolve() == folder.resolve():
            reached = [p["step"] for p in run.get("curve", []) if p["accuracy"] >= target]
            return min(reached) if reached else None
    return None


def measured_history(folder: Path) -> list[dict[str, Any]]:
    return [
        {"submitted_at": w.submitted_at, "finished_at": w.finished_at} for w in step_windows(folder)
    ]


def predict_from_run(
    folder: Path,
    *,
    staleness: Sequence[int] = (1,),
    contention: float | None = None,
    at_step: int | None = None,
    costs_from: Path | None = None,
    early_start: bool | None = None,
) -> dict[str, Any]:
    """Every registered mode's step time (measured as ``replay.step_time`` measures a run) and
    time to the end of step ``at_step`` (None: the run's last) from one run of any mode; the
    run's own measured step time beside its mode's prediction; a streaming learner with
    ``early_start`` (None: as the run's config says)."""
    source, _ = run_mode(folder)
    work, kappa, costs = fitted_workload(
        folder, contention=contention, costs_from=costs_from, early_start=early_start
    )
    history = measured_history(folder)
    at = len(history) if at_step is None else at_step
    if not 1 <= at <= len(history):
        raise ValueError(f"{folder}: step {at} is not one of its steps 1..{len(history)}")
    modes: dict[str, Any] = {}
    for k in staleness:
        for mode in registered_modes(k):
            if mode.label in modes:
                continue
            # as many steps as the run: an async run's batches finish in clumps (two in
            # flight sharing the cores end together), so its throughput once full depends
            # on where the run stops; predicted past it, the matrix's async cells read
            # 5–20 points further off (docs/measurements.md, 2026-12-06); at least one step
            # past its pipeline's filling, which a run of fewer steps does not reach
            skip = mode.batches_in_flight
            steps = drive(mode, work, steps=max(len(history), skip + 1))
            predicted: dict[str, Any] = {
                # measured as the run is: one batch in flight, the first step left out
                "step_time_s": step_time(steps if skip > 1 else steps[1:], mode),
                "time_to_step_s": steps[at - 1]["finished_at"],
                "same_updates": mode.exact,
                "baseline": mode.baseline,
            }
            if mode.label == source.label:
                predicted["measured_step_time_s"] = step_time(
                    history if source.batches_in_flight > 1 else history[1:], source
                )
                predicted["error"] = (
                    predicted["step_time_s"] / predicted["measured_step_time_s"] - 1
                )
            modes[mode.label] = predicted
    measured_to = history[at - 1]["finished_at"] - history[0]["submitted_at"]
    return {
        "run": folder.name,
        "from_mode": source.label,
        "at_step": at,
        "early_start": work.early_start,
        "measured_time_to_step_s": measured_to,
        "contention": {
            "kappa": kappa.kappa,
            "generation_slowdown": kappa.generation_slowdown,
            "engine_share": kappa.engine_share,
            "measured": kappa.measured,
        },
        "loads": _loads_said(work),
        "learner_load": work.learner_load,
        "learner": {
            "pass_overhead_s": costs.pass_overhead_s,
            "forward_per_token_s": costs.forward_per_token_s,
            "backward_per_token_s": costs.backward_per_token_s,
            "optimizer_s": costs.optimizer_s,
            "fold_s": costs.fold_s,
            "fitted_to": costs.source,
        },
        "modes": modes,
    }


def _loads_said(work: Workload) -> dict[str, Any]:
    """How many batches' rollout loads the run's readings said (``rollout_sharing``), of how
    many, and their mean share of the rollout's cores (None: no readings in the run)."""
    said = [load for load in work.loads if load != ((0.0, 0.0),)]
    shares = [share for load in said for _, share in load]
    return {
        "batches": len(work.items),
        "said": len(said),
        "mean_share": sum(shares) / len(shares) if shares else None,
    }
