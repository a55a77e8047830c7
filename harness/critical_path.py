"""Step times of a training run, read from its run folder, and the bound T* that no
zero-staleness schedule can beat (docs/design.md §4).

For one batch with reward-ready times cᵢ (from the batch's start) and learner work bᵢ per
trajectory, the best any zero-staleness schedule can do on one learner is

    T* = max_k ( c₍ₖ₎ + Σ_{j≥k} b₍ⱼ₎ ) + optimizer + weight sync

over trajectories sorted by cᵢ. bᵢ is trajectory i's share of the *batched* learner time of a
sync run, by its tokens: bᵢ = L_sync · nᵢ / Σ n (``BatchedCost``; L_sync / N where the lengths
are unknown). A lone trajectory's backward costs more, so this bound assumes streaming loses
nothing to batching; and the share follows the tokens because the long trajectories (more
turns) are the expensive ones and finish last. Streaming's efficiency is T* / T.

With early start a trajectory's backward may begin when its episode completes (eᵢ), before
its reward: the bound is then max( max_k (e₍ₖ₎ + Σ_{j≥k} b₍ⱼ₎), max cᵢ ) + optimizer + sync.

For OPD the work items are turns, each ready at its teacher score; the step cannot close
before the batch's last episode has ended either (until an episode ends, another turn may
come: a last tool call runs after the last scored action), so the tail is at least max eᵢ.

For the simulator's replay (``harness/replay.py``) a step also carries each trajectory's
length in tokens (its context, from the token counts ``events.jsonl`` keeps) and the learner's
passes with the padded tokens each computed, so that a pass can be charged by the rows × the
longest row it computes.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from thundersync.core.micro_batches import chunk_shapes
from thundersync.protocol.episode import EpisodeKey, step_of
from thundersync.training.run_metrics import read_metrics


@dataclass(frozen=True, slots=True)
class EpisodeTimes:
    """One trajectory of a step's batch, as the learner's schedule and costs see it."""

    episode_id: str
    group_id: str
    tokens: int
    """Its context length (prompt, actions, and every observation but the last: what
    ``Trajectory.context_length`` counts): a padded forward computes each row of a
    micro-batch to the longest; 0 when the run's events do not say."""
    completed: float | None
    """``EpisodeCompleted``: its last action fixed (early start may begin its backward)."""
    reward: float | None
    """``RewardReady``."""
    value: float | None = None
    """The reward itself (None where the run's events do not say)."""


@dataclass(frozen=True, slots=True)
class LearnerPass:
    """One backward pass of the learner: the backward spans that share a start (one drained
    piece of work: a lone trajectory's piece, an open group's batched deposit, or batched
    finals)."""

    started: float
    seconds: float
    items: int
    padded_tokens: int = 0
    """Σ over its micro-batches (shortest first, ``micro_batch_size`` rows) of rows × the
    longest row's tokens; 0 when a length is unknown (OPD's per-turn pieces, no
    trajectories kept)."""
    micro_batches: int = 1
    backwards: int = 1
    """Backwards per micro-batch: finals one (their advantages are final); a lone piece one
    for ∇ℓ and one for the KL term when there is one; a batched deposit of one reward the same
    (``micro_batches.weight_classes``), of mixed rewards one per sum (Σ cᵢhᵢ, Σ hᵢ and with a
    KL term Σ kᵢ: ``batch.piece_sums``); the rest of early start's split one."""
    forwards: int = 1
    """Forwards per micro-batch: the policy's, and the reference's where the pass computes
    the KL term (every pass of a run with one but the rest of early start's split)."""


@dataclass(frozen=True, slots=True)
class StepWindow:
    """One step of a run: when its batch was handed to rollout and when the step ended,
    its episodes' reward-ready times, and the learner spans inside it."""

    step: int
    submitted_at: float
    finished_at: float
    reward_times: tuple[float, ...]
    durations: dict[str, float]
    """Summed span durations by name (step, optimizer, weight_publish, ...) in the window."""
    completed_times: tuple[float, ...] = ()
    """When each episode's last action was fixed (``EpisodeCompleted``)."""
    teacher_times: tuple[float, ...] = ()
    """OPD: when the teacher scored each turn (``TeacherScored``), the moment that turn's
    gradient can start."""
    passes: tuple[LearnerPass, ...] = ()
    """The learner's backward passes in the window. Items of one pass share its start (a
    drained micro-batch)."""
    step_interval_s: float | None = None
    """Seconds since the previous step ended (``metrics.jsonl``'s ``step_time_s``): the
    run's throughput, which differs from ``time_s`` when batches overlap (async)."""
    episodes: tuple[EpisodeTimes, ...] = ()
    """The batch's trajectories (those with a ``RewardReady``)."""
    step_started: float | None = None
    """When the learner's ``step`` span (``learner.step()``) began."""

    @property
    def time_s(self) -> float:
        return self.finished_at - self.submitted_at

    @property
    def work_times(self) -> tuple[float, ...]:
        """When each piece of gradient work had its inputs (rewards for GRPO, teacher scores
        per turn for OPD)."""
        return self.teacher_times or self.reward_times

    @property
    def learner_time_s(self) -> float:
        """The learner's batched work in this step: ``learner.step()`` minus its optimizer."""
        return max(self.durations.get("step", 0.0) - self.durations.get("optimizer", 0.0), 0.0)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


_TIMES = {"RewardReady": 0, "EpisodeCompleted": 1, "TeacherScored": 2}


def context_tokens(events: list[dict[str, Any]]) -> dict[str, int]:
    """Each completed episode's context length in tokens, from ``events.jsonl``'s lengths
    (``*_len``): the prompt, every action, and every observation but the last turn's, as
    ``Trajectory.context_length`` counts what the learner's forward computes."""
    prompt: dict[str, int] = {}
    turns: dict[str, int] = {}
    actions: dict[str, dict[int, int]] = {}
    observations: dict[str, dict[int, int]] = {}
    for e in events:
        eid, kind = str(e.get("episode_id", "")), e.get("event")
        if kind == "EpisodeStarted":
            prompt[eid] = int(e.get("prompt_ids_len", 0))
        elif kind == "TurnCompleted":
            actions.setdefault(eid, {})[int(e["turn"])] = int(e.get("action_ids_len", 0))
        elif kind == "ToolFinished":
            observations.setdefault(eid, {})[int(e["turn"])] = int(e.get("observation_ids_len", 0))
        elif kind == "EpisodeCompleted":
            turns[eid] = int(e.get("num_turns", 0))
    out = {}
    for eid, n in turns.items():
        if eid in prompt:
            acted, seen = actions.get(eid, {}), observations.get(eid, {})
            out[eid] = (
                prompt[eid]
                + sum(acted.get(k, 0) for k in range(n))
                + sum(seen.get(k, 0) for k in range(n - 1))
            )
    return out


def _episodes(events: list[dict[str, Any]]) -> dict[int, list[EpisodeTimes]]:
    """The trajectories of each batch (those graded), with their tokens and times."""
    tokens = context_tokens(events)
    completed = {e["episode_id"]: float(e["t"]) for e in events if e["event"] == "EpisodeCompleted"}
    out: dict[int, list[EpisodeTimes]] = {}
    for e in events:
        eid = str(e.get("episode_id", ""))
        key = EpisodeKey.parse(eid)
        if e.get("event") == "RewardReady" and key is not None and key.step is not None:
            value = e.get("reward")
            times = EpisodeTimes(
                eid,
                key.group_id,
                tokens.get(eid, 0),
                completed.get(eid),
                float(e["t"]),
                None if value is None else float(value),
            )
            out.setdefault(key.step, []).append(times)
    return out


def _learner_passes(
    passes: dict[float, list[dict[str, Any]]],
    episodes: dict[str, EpisodeTimes],
    closes: dict[str, float],
    *,
    micro_batch_size: int,
    kl: bool,
) -> tuple[LearnerPass, ...]:
    """The passes whose backward spans (one per item) share each start, in order. A pass's
    kind is read from the rewards and from its items' earlier passes: finals when every
    item's group had all its rewards in before it started (one backward); an item's second
    pass is the rest of early start's split work ((rᵢ − c) hᵢ, one backward); else a piece
    before its reward (early start: hᵢ, with a KL term kᵢ too), a lone deposit or a batched
    deposit of one reward (the same: ``batch.weight_classes``), or a batched deposit of
    mixed rewards (Σ cᵢhᵢ, Σ hᵢ and Σ kᵢ)."""
    seen: set[str] = set()
    out = []
    for started, spans in sorted(passes.items()):
        seconds = max(s["finished"] for s in spans) - started
        ids = [str(s.get("episode_id")) for s in spans]
        items = [episodes.get(eid) for eid in ids]
        lengths = [e.tokens if e and s.get("turn") is None else 0 for e, s in zip(items, spans)]
        shapes = chunk_shapes(lengths, micro_batch_size)
        padded = sum(rows * longest for rows, longest in shapes) if all(lengths) else 0
        final = all(
            e is not None and closes.get(e.group_id, float("inf")) <= started for e in items
        )
        rewarded = all(
            e is not None and e.reward is not None and e.reward <= started for e in items
        )
        second = any(eid in seen for eid in ids)
        values = {e.value if e is not None else None for e in items}
        shared = len(values) == 1 and None not in values  # one reward: one backward for both
        if final or second:
            backwards = 1
        elif len(spans) == 1 or not rewarded or shared:
            backwards = 1 + int(kl)
        else:
            backwards = 2 + int(kl)
        forwards = 1 if second else 1 + int(kl)
        seen.update(ids)
        shape = (len(spans), padded, len(shapes), backwards, forwards)
        out.append(LearnerPass(started, seconds, *shape))
    return tuple(out)


def step_windows(run: Path) -> list[StepWindow]:
    """The steps of the run folder ``run`` (from metrics.jsonl, events.jsonl, spans.jsonl,
    and config.json's ``micro_batch_size`` and KL term for the passes' shapes)."""
    metrics = read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").is_file() else []
    events = read_jsonl(run / "events.jsonl")
    spans = read_jsonl(run / "spans.jsonl")
    config = (
        json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else {}
    )
    micro_batch_size = int(config.get("micro_batch_size", 8))
    kl = float((config.get("objective") or {}).get("kl_coef", 0.0)) != 0.0
    times: dict[int, tuple[list[float], list[float], list[float]]] = {}
    for e in events:
        kind = _TIMES.get(e.get("event", ""))
        batch = step_of(str(e.get("episode_id", "")))
        if kind is not None and batch is not None:
            times.setdefault(batch, ([], [], []))[kind].append(float(e["t"]))
    batches = _episodes(events)
    by_id = {e.episode_id: e for episodes in batches.values() for e in episodes}
    closes: dict[str, float] = {}  # each group's last reward
    for episode in by_id.values():
        if episode.reward is not None:
            group = episode.group_id
            closes[group] = max(closes.get(group, episode.reward), episode.reward)
    windows, previous_end = [], float("-inf")
    for m in metrics:
        lo, hi = float(m["submitted_at"]), float(m["finished_at"])
        # the learner's spans of this step: after the previous step ended (async rolls batches
        # out while the learner still works on older ones, so their windows overlap)
        learner_lo, previous_end = max(lo, previous_end), hi
        durations: dict[str, float] = {}
        passes: dict[float, list[dict[str, Any]]] = {}
        step_started = None
        for s in spans:
            if s.get("worker") == "learner" and learner_lo <= s["started"] and s["finished"] <= hi:
                durations[s["name"]] = durations.get(s["name"], 0.0) + s["finished"] - s["started"]
                if s["name"] == "backward":
                    passes.setdefault(s["started"], []).append(s)
                elif s["name"] == "step":
                    step_started = s["started"]
        batch = m["step"] - 1  # step N trains on batch N-1 (episode ids s<N-1>-…)
        rewards, completed, teacher = times.get(batch, ([], [], []))
        windows.append(
            StepWindow(
                m["step"],
                lo,
                hi,
                tuple(rewards),
                durations,
                tuple(completed),
                tuple(teacher),
                _learner_passes(passes, by_id, closes, micro_batch_size=micro_batch_size, kl=kl),
                m.get("step_time_s"),
                tuple(batches.get(batch, ())),
                step_started,
            )
        )
    return windows


@dataclass(frozen=True, slots=True)
class BatchedCost:
    """A sync run's batched learner time, as the strict bound charges it to a work item."""

    per_item: float
    """L_sync / N (``batched_cost_per_trajectory``)."""
    per_token: float | None = None
    """L_sync / Σ nᵢ over the batch's trajectories' context tokens, the median over steps;
    None where the lengths are unknown (OPD's items are turns)."""


def batched_cost(sync_run: Path) -> BatchedCost:
    """The strict bound's costs from a sync run: per item, and per token where its events say
    every trajectory's length."""
    windows = [w for w in step_windows(sync_run) if w.work_times]
    per_item = _cost_per_item(windows, sync_run)
    sized = [w for w in windows if w.episodes and all(e.tokens for e in w.episodes)]
    if not sized or any(w.teacher_times for w in windows):
        return BatchedCost(per_item)
    per_token = statistics.median(
        w.learner_time_s / sum(e.tokens for e in w.episodes) for w in sized
    )
    return BatchedCost(per_item, per_token)


def batched_cost_per_trajectory(sync_run: Path) -> float:
    """bᵢ = L_sync / N: the sync run's learner time per step (its ``learner.step()`` minus
    the optimizer), divided by the work items per batch (trajectories for GRPO, turns for
    OPD); the median over steps."""
    return _cost_per_item([w for w in step_windows(sync_run) if w.work_times], sync_run)


def _cost_per_item(windows: list[StepWindow], sync_run: Path) -> float:
    if not windows:
        raise ValueError(f"{sync_run}: no complete steps to measure the learner's cost on")
    return statistics.median(w.learner_time_s / len(w.work_times) for w in windows)


def pass_cost(windows: list[StepWindow]) -> tuple[float, float]:
    """(o, b): the fixed cost of a backward pass and the cost per work item in it, fitted by
    least squares to the passes of ``windows`` (seconds = o + k·b for a pass of k items). With
    passes of one size only, o is 0 and b their mean seconds per item."""
    passes = [(p.items, p.seconds) for w in windows for p in w.passes]
    if not passes:
        raise ValueError("no backward passes recorded (a sync run computes inside its step)")
    n = len(passes)
    mean_k = sum(k for k, _ in passes) / n
    mean_t = sum(t for _, t in passes) / n
    spread = sum((k - mean_k) ** 2 for k, _ in passes)
    if spread == 0:
        return 0.0, mean_t / mean_k
    b = sum((k - mean_k) * (t - mean_t) for k, t in passes) / spread
    o = mean_t - b * mean_k
    if b <= 0 or o < 0:  # noise: a fit that says items are free or passes pay back
        return 0.0, sum(t for _, t in passes) / sum(k for k, _ in passes)
    return o, b


def token_pass_cost(windows: list[StepWindow]) -> tuple[float, float, float]:
    """(o, f, g): a pass costs o per micro-batch plus, per padded token (rows × the longest
    row, what a padded forward computes), f for each forward (the policy's; the reference's
    with a KL term) and g for each backward:

        seconds = o · micro-batches + padded tokens · (forwards · f + backwards · g)

    fitted by least squares to the passes of ``windows``, none of the three negative. A
    trajectory's cost grows with its length (ToySum episodes run one to eight turns, and the
    last to finish are the longest), and a batched deposit's three backwards cost more per
    token than finals' one: one cost per item and pass (``pass_cost``) charged a closing pass
    of long trajectories a third to a half of what it took. Where the passes cannot tell two
    of the costs apart (all of one kind: f from g; all of one shape: f from o), the fit keeps
    f, the cost per token, then g, then o.

    A pass's kind is read from the rewards (``step_windows``): a deposit that ran after its
    group closed, later in the same drain, reads as finals (one backward for three)."""
    passes = [p for w in windows for p in w.passes]
    if not passes:
        raise ValueError("no backward passes recorded (a sync run computes inside its step)")
    if not all(p.padded_tokens for p in passes):
        raise ValueError("a pass's padded tokens are unknown (no lengths for its items)")
    rows = [
        (
            float(p.padded_tokens * p.forwards),
            float(p.padded_tokens * p.backwards),
            float(p.micro_batches),
        )
        for p in passes
    ]
    f, g, o = nonnegative_least_squares(rows, [p.seconds for p in passes])
    return o, f, g


def nonnegative_least_squares(
    rows: Sequence[Sequence[float]], ys: Sequence[float]
) -> tuple[float, ...]:
    """The coefficients c ≥ 0 minimising Σ (y − row·c)², by trying every subset of the
    columns (a handful here), fewest first, and keeping the best fit whose coefficients are
    all ≥ 0; a subset whose columns are collinear is skipped, and of fits that are as good
    the first is kept: the earlier columns."""
    a, y = np.asarray(rows, dtype=float), np.asarray(ys, dtype=float)
    width = a.shape[1]
    best: tuple[float, tuple[float, ...]] | None = None
    for size in range(1, width + 1):
        for columns in itertools.combinations(range(width), size):
            part = a[:, columns]
            if np.linalg.matrix_rank(part) < size:
                continue
            coefficients = np.linalg.lstsq(part, y, rcond=None)[0]
            if coefficients.min() < 0:
                continue
            full = np.zeros(width)
            full[list(columns)] = coefficients
            error = float(((y - a @ full) ** 2).sum())
            if best is None or error < best[0] * (1 - 1e-9):
                best = (error, tuple(float(c) for c in full))
    return best[1] if best is not None else (0.0,) * width


def bound(window: StepWindow, cost: float | BatchedCost, *, early_start: bool = False) -> float:
    """T* of one step (seconds from its batch's start), each work item charged ``cost`` (OPD:
    each turn, from its teacher score); a ``BatchedCost`` with a cost per token charges each
    trajectory its tokens' share."""
    items = _charged(window, cost, early_start=early_start)
    items.sort()
    rest = sum(b for _, b in items)
    tail = 0.0
    for ready, b in items:
        tail, rest = max(tail, ready + rest), rest - b
    if early_start and not window.teacher_times:
        tail = max([tail, *(t - window.submitted_at for t in window.reward_times)])
    if window.teacher_times:  # OPD: no turn is known to be the last before its episode ends
        tail = max([tail, *(t - window.submitted_at for t in window.completed_times)])
    overhead = window.durations.get("optimizer", 0.0) + window.durations.get("weight_publish", 0.0)
    return tail + overhead


def _charged(
    window: StepWindow, cost: float | BatchedCost, *, early_start: bool
) -> list[tuple[float, float]]:
    """(ready time from the batch's start, cost) of each of the step's work items."""
    start = window.submitted_at
    per_token = cost.per_token if isinstance(cost, BatchedCost) else None
    episodes = window.episodes
    if (
        per_token is not None
        and not window.teacher_times
        and episodes
        and all(e.tokens for e in episodes)
    ):
        ready = [
            e.completed if early_start and e.completed is not None else e.reward for e in episodes
        ]
        return [(t - start, per_token * e.tokens) for t, e in zip(ready, episodes) if t is not None]
    each = cost.per_item if isinstance(cost, BatchedCost) else cost
    times = window.work_times
    if early_start and not window.teacher_times:
        times = window.completed_times
    return [(t - start, each) for t in times]


def summarize(
    run: Path, cost: float | BatchedCost | None = None, *, skip_first: bool = True
) -> dict[str, Any]:
    """Median step time and, given bᵢ (``cost``), median T* and T*/T of a run (its first step,
    a warm-up, left out when ``skip_first`` and there are others)."""
    windows = step_windows(run)
    if skip_first and len(windows) > 1:
        windows = windows[1:]
    if not windows:
        raise ValueError(f"{run}: no steps to summarise")
    out: dict[str, Any] = {
        "steps": len(windows),
        "step_time_s": statistics.median(w.time_s for w in windows),
        "step_times_s": [w.time_s for w in windows],
    }
    if cost is not None:
        config = run / "config.json"
        early = config.is_file() and bool(json.loads(config.read_text()).get("early_start"))
        bounds = [bound(w, cost, early_start=early) for w in windows]
        out["bound_s"] = statistics.median(bounds)
        out["efficiency"] = statistics.median(b / w.time_s for b, w in zip(bounds, windows))
    return out


def held_pieces(folder: Path, config: dict[str, Any]) -> bool:
    """Whether an early-start run held whole pieces to their rewards (its buffers went past
    two per group and one more, which only a budget with room for them allows) rather than
    splitting the work (docs/design.md §3)."""
    copies = 2 * int(config.get("tasks_per_step", 1)) + 1
    learners = [m.get("learner") or {} for m in read_metrics(folder / "metrics.jsonl")]
    return any(
        learner.get("peak_buffer_bytes", 0) > copies * learner.get("buffer_bytes", 1)
        for learner in learners
    )
