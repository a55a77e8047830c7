"""A simulated ``Run`` on a virtual clock that the real mode objects drive unchanged
(``thundersync/training/modes/``; docs/design.md §4): a mode's semantics are written once.

No threads and no sleeps: a deterministic event loop. ``submit`` starts a batch's rollout;
its items fall due after the workload's ready times of rollout; ``wait_batch`` and
``arrivals`` move the clock to the events the mode waits for; the learner's passes
(``learner.drain``) and ``finish_step`` (intake, ``step()``'s work, optimizer, weight sync)
move it by what they cost. While the learner computes, rollout runs 1 + κ times slower
(``Workload.contention``): on a machine where the engine, tools and graders share the
learner's cores, what streaming and async overlap costs the rollout. Batches rolling out
together (async) share the rollout's cores (``Workload.loads``): where their measured loads
add past 1, each runs that many times slower. Where the learner's own load is known
(``Workload.learner_load``), it shares them too, in place of κ: the learner slows as well.

The learner is asked only what the mode's contract says (``LearnerContract.streams``): a
learner that streams drains what arrived (per group as ``StreamingGRPO`` does where the
workload has its trajectories: ``harness/grpo_drain.py``; else one pass of everything that
arrived, or with ``eager`` a pass per item); one that does not learns the batch at ``step()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.contention import Load, load_at
from harness.grpo_drain import GrpoDrain
from harness.workload import Workload, batch_seconds, pass_seconds
from thundersync.protocol import events as ev
from thundersync.training.modes import Arrivals, Mode


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemDue(ev.Event):
    """A simulated batch's item has its inputs (``rewarded``: its reward; else its completion,
    or for a workload of ready times alone, the inputs of its work)."""

    step: int
    index: int
    rewarded: bool
    work: bool
    """Whether it unblocks learner work (a batch's closing reward after OPD's scores does not)."""


@dataclass(slots=True)
class _Rollout:
    """One batch in flight: its start, its rollout's progress, and its items by due time."""

    started: float
    due: list[tuple[float, ItemDue]]
    load: Load = ()
    progress: float = 0.0
    taken: int = 0

    @property
    def end(self) -> float:
        """Rollout seconds to its last item: past it, it uses no core."""
        return self.due[-1][0] if self.due else 0.0


class VirtualRun:
    """The ``Run`` a mode drives, on a virtual clock (``now``, seconds)."""

    def __init__(
        self, w: Workload, *, streams: bool, eager: bool = False, steps: int | None = None
    ) -> None:
        self.w, self.now = w, 0.0
        self.num_steps = len(w.ready_s) if steps is None else steps
        self.rollouts: dict[int, _Rollout] = {}
        self.batch_of: dict[int, int] = {}  # a submitted step's batch of the workload
        self.version = 0  # optimizer steps taken: the policy the engine samples with
        self.busy_s = 0.0
        self._learner = VirtualLearner(self, streams=streams, eager=eager)

    @property
    def learner(self) -> VirtualLearner:
        return self._learner

    def steps(self) -> range:
        return range(self.num_steps)

    def submit(self, step: int) -> None:
        """Batch ``step`` rolls out the workload's batch ``step``, or with
        ``Workload.by_version`` the batch sampled with the policy the engine has now."""
        last = len(self.w.ready_s) - 1
        batch = min(self.version if self.w.by_version else step, last)
        self.batch_of[step] = batch
        load = self.w.loads[batch] if self.w.loads else ()
        self.rollouts[step] = _Rollout(self.now, _due(self.w, batch, step), load)

    def _rates(self, *, busy: bool) -> tuple[dict[int, float], float, float]:
        """Each batch's rollout seconds per second now, the learner's work seconds per second
        (while ``busy``), and the seconds until one changes. With ``Workload.learner_load``
        the learner's ℓ and the loads of the batches still rolling out share the cores:
        everyone slowed by their sum where it passes 1. Without, rollout runs 1 + κ times
        slower while the learner is ``busy``, and batches rolling out together are slowed
        by the sum of their loads where it passes 1; the learner runs at full speed."""
        shared = self.w.learner_load is not None and bool(self.w.loads)
        base = 1.0 / (1.0 + self.w.contention) if busy and not shared else 1.0
        active = {s: r for s, r in self.rollouts.items() if r.progress < r.end - 1e-12}
        rate, learner, left = base, 1.0, math.inf
        if self.w.loads and (len(active) > 1 or (shared and busy and active)):
            shares = [load_at(r.load, r.progress) for r in active.values()]
            total = sum(share for share, _ in shares)
            if shared and busy:
                total += self.w.learner_load or 0.0
                learner = 1.0 / max(1.0, total)
            rate = base / max(1.0, total)
            left = min(until for _, until in shares)
        rates = {s: rate if s in active else base for s in self.rollouts}
        horizon = min(
            (min(r.end - r.progress, left) / rate for r in active.values()), default=math.inf
        )
        return rates, learner, horizon

    def advance(self, seconds: float, *, busy: bool) -> None:
        """Move on by ``seconds`` of the learner's work (``busy``) or of idling; the batches
        in flight progress at ``_rates``, and the learner's work at its own."""
        while seconds > 0.0:
            rates, learner, horizon = self._rates(busy=busy)
            dt = min(seconds / learner, max(horizon, 1e-9))
            for step, rollout in self.rollouts.items():
                rollout.progress += dt * rates[step]
            self.now += dt
            self.busy_s += dt if busy else 0.0
            seconds -= dt * learner

    def _wait(self, step: int, *, everything: bool, timeout_s: float | None = None) -> None:
        """Idle until batch ``step``'s next item (``everything``: its last) falls due."""
        rollout = self.rollouts[step]
        if rollout.taken >= len(rollout.due):
            return
        target = rollout.due[-1 if everything else rollout.taken][0]
        budget = math.inf if timeout_s is None else timeout_s
        while rollout.progress < target - 1e-12 and budget > 0.0:
            rates, _, horizon = self._rates(busy=False)
            dt = min((target - rollout.progress) / rates[step], max(horizon, 1e-9), budget)
            self.advance(dt, busy=False)
            budget -= dt

    def _take(self, step: int) -> list[ev.Event]:
        rollout = self.rollouts[step]
        out: list[ev.Event] = []
        while rollout.taken < len(rollout.due) and rollout.due[rollout.taken][0] <= (
            rollout.progress + 1e-12
        ):
            out.append(rollout.due[rollout.taken][1])
            rollout.taken += 1
        return out

    def wait_batch(self, step: int) -> list[ev.Event]:
        self._wait(step, everything=True)
        return self._take(step)

    def arrivals(self, step: int, timeout_s: float | None = None) -> Arrivals:
        rollout = self.rollouts[step]
        if not rollout.taken < len(rollout.due) or rollout.due[rollout.taken][0] > (
            rollout.progress + 1e-12
        ):
            self._wait(step, everything=False, timeout_s=timeout_s)
        events = self._take(step)
        return Arrivals(events, rollout.taken == len(rollout.due))

    def finish_step(self, step: int) -> dict[str, Any]:
        rollout = self.rollouts.pop(step)
        w = self.w
        self.advance(w.intake_s + self._learner.step_seconds(step) + w.optimizer_s, busy=True)
        self.advance(w.sync_s, busy=True)
        self.version += 1
        return {"step": step + 1, "submitted_at": rollout.started, "finished_at": self.now}


class VirtualLearner:
    """The ``EventLearner`` the mode hands events to; its work moves the run's clock."""

    def __init__(self, run: VirtualRun, *, streams: bool, eager: bool) -> None:
        self.run, self.streams, self.eager = run, streams, eager
        self.pending = 0
        self.drains: dict[int, GrpoDrain] = {}

    def _drain_of(self, step: int) -> GrpoDrain | None:
        w = self.run.w
        if not (self.streams and w.items):
            return None
        if step not in self.drains:
            self.drains[step] = GrpoDrain(w.items[self.run.batch_of[step]], w)
        return self.drains[step]

    def consume(self, event: ev.Event) -> None:
        if not isinstance(event, ItemDue) or not self.streams:
            return  # a batched learner computes at step(); one that streams, as work arrives
        drain = self._drain_of(event.step)
        if drain is not None:
            drain.see(event.index, rewarded=event.rewarded)
        elif event.work and self.eager:
            self.run.advance(pass_seconds((0,), self.run.w), busy=True)
        elif event.work:
            self.pending += 1

    def drain(self) -> None:
        drains = list(self.drains.values())
        seconds = sum(d.drain() for d in drains)
        if self.pending:
            seconds += pass_seconds((0,) * self.pending, self.run.w)
            self.pending = 0
        if seconds:
            self.run.advance(seconds, busy=True)

    def wake_after(self) -> float | None:
        # come straight back where a drain left deposits (GrpoDrain); no ski-rental hold
        return 0.0 if any(d.deferred for d in self.drains.values()) else None

    def step_seconds(self, step: int) -> float:
        """``step()``'s work beyond the optimizer: the batch's passes, or a streaming
        learner's folds."""
        drain = self.drains.pop(step, None)
        w, batch = self.run.w, self.run.batch_of[step]
        if not self.streams:
            return batch_seconds(w, batch)
        return w.fold_s + (drain.drain(defer=False) if drain is not None else 0.0)


def _due(w: Workload, batch: int, step: int) -> list[tuple[float, ItemDue]]:
    """The events of the workload's batch ``batch``, rolled out as step ``step``, by their
    rollout time: a GRPO trajectory's completion and reward, or each work item's ready time
    and the batch's closing gate."""
    due: list[tuple[float, ItemDue]] = []
    if w.items:
        for i, item in enumerate(w.items[batch]):
            for t, rewarded in ((item.completed, False), (item.reward, True)):
                event = ItemDue(step=step, index=i, rewarded=rewarded, work=True, t=t)
                due.append((t, event))
    else:
        for i, t in enumerate(w.ready_s[batch]):
            due.append((t, ItemDue(step=step, index=i, rewarded=True, work=True, t=t)))
        gate = w.gate(batch)
        if gate > max(w.ready_s[batch], default=0.0):
            closing = ItemDue(step=step, index=-1, rewarded=True, work=False, t=gate)
            due.append((gate, closing))
    due.sort(key=lambda pair: (pair[0], pair[1].index, pair[1].rewarded))
    return due


def drive(
    mode: Mode, w: Workload, *, eager: bool = False, steps: int | None = None
) -> list[dict[str, Any]]:
    """Each step's metrics (``submitted_at``, ``finished_at``) of ``mode`` run on ``w`` for
    ``steps`` (None: the workload's): the mode object's own loop (``Mode.run``) over a
    ``VirtualRun``."""
    run = VirtualRun(w, streams=mode.learner_contract().streams, eager=eager, steps=steps)
    return mode.run(run)
