"""Exact streaming GRPO: per-trajectory backward passes folded into per-group accumulators.

For group g with rewards r_i, shift c (the first reward deposited) and h_i = ∇ℓ_i:

    Σ_i A_i h_i = ( R_g − (μ_g − c) H_g ) / s_g,   R_g = Σ (r_i − c) h_i,   H_g = Σ h_i

which is DESIGN §3's (R − μH)/(σ+ε) with the rewards shifted by c: the same value, less
cancellation, and a group whose rewards are all equal deposits exact zeros (r_i − c = 0).
Without std scaling (s = 1) R_g needs no buffer: (r_i − c) h_i goes straight into the
step's gradient, so a group costs one buffer. A trajectory whose group is already closed is
processed with its final advantage directly (one backward, no buffer); so is every member of
a group that could not open within the buffer budget: exact, just later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from thundersync import events as ev
from thundersync.assembly import EpisodeRecord, natural_key
from thundersync.batch import weighted_grad
from thundersync.gradients import BufferPool, grpo_piece
from thundersync.objectives import GRPO, group_stats, is_degenerate
from thundersync.policy import Policy


@dataclass(slots=True)
class GroupState:
    group_id: str
    size: int
    members: dict[str, EpisodeRecord] = field(default_factory=dict)
    R: torch.Tensor | None = None
    H: torch.Tensor | None = None
    K: torch.Tensor | None = None
    result: torch.Tensor | None = None
    shift: float | None = None
    closed: bool = False
    dropped: bool = False
    stats: tuple[float, float] = (0.0, 1.0)

    def rewards_known(self) -> bool:
        return sum(m.has_reward for m in self.members.values()) >= self.size

    def kept(self) -> list[EpisodeRecord]:
        live = [m for m in self.members.values() if not m.is_infra_failure]
        return sorted(live, key=lambda m: natural_key(m.episode_id))


def kept_rewards(members: list[EpisodeRecord]) -> list[float]:
    return [m.reward.reward for m in members if m.reward is not None]


class GRPOStream:
    """Streaming GRPO for one batch. ``update`` after every consumed event; ``finish`` at
    the step returns the batch's gradient sum (before the denominator D)."""

    def __init__(
        self,
        policy: Policy,
        objective: GRPO,
        pool: BufferPool,
        *,
        reference: Policy | None,
        early_start: bool,
        micro_batch_size: int,
        publish: Callable[[ev.Event], None] | None,
    ) -> None:
        self.policy, self.objective, self.pool = policy, objective, pool
        self.reference, self.early_start, self.publish = reference, early_start, publish
        self.micro_batch_size = micro_batch_size
        self.groups: dict[str, GroupState] = {}
        self.queue: dict[str, EpisodeRecord] = {}
        self.pending: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.handled: set[str] = set()
        self.step_grad = pool.zeros()
        self.num_backward = 0

    # --- event-driven work -------------------------------------------------------------------

    def update(self, rec: EpisodeRecord) -> None:
        """Note what ``rec``'s new event unblocked; the work itself runs in ``drain``."""
        if rec.started is None:
            return
        g = self.groups.setdefault(rec.group_id, GroupState(rec.group_id, rec.started.group_size))
        g.members[rec.episode_id] = rec
        eid = rec.episode_id
        if eid not in self.handled:
            if rec.is_infra_failure:
                self._release_pending(eid)
                self.handled.add(eid)
                self.queue.pop(eid, None)
            elif rec.tokens_ready and (rec.has_reward or g.closed or self.early_start):
                self.queue[eid] = rec
        if not g.closed and g.rewards_known():
            self._close(g)

    def drain(self) -> None:
        """Run the queued work. Trajectories of closed groups have final advantages and are
        batched (one padded backward per micro-batch, like sync); trajectories of open groups
        are deposited into their group's accumulators one by one."""
        finals: list[tuple[GroupState, EpisodeRecord]] = []
        queued, self.queue = list(self.queue.values()), {}
        for rec in queued:
            g = self.groups[rec.group_id]
            if rec.episode_id in self.handled:
                continue
            if g.closed and rec.episode_id in self.pending:
                self._apply_pending(g, rec)
            elif g.closed:
                finals.append((g, rec))
            elif rec.has_reward:
                self._deposit(g, rec)
            elif self.early_start and rec.episode_id not in self.pending:
                self._precompute(rec)
        self._run_finals(finals)

    def _run_finals(self, finals: list[tuple[GroupState, EpisodeRecord]]) -> None:
        by_target: dict[int, tuple[torch.Tensor, list]] = {}
        for g, rec in finals:
            if g.dropped:
                self.handled.add(rec.episode_id)
                continue
            target = self._target(g)
            if target is None:
                continue  # max_groups over budget: computed at the step, once selected
            by_target.setdefault(id(target), (target, []))[1].append(
                (rec, self._advantage(g, rec))
            )
        for target, items in by_target.values():
            started = ev.now()
            weighted_grad(
                self.policy, self.objective, items, self.reference,
                micro_batch_size=self.micro_batch_size, total=target,
            )  # fmt: skip
            for rec, _ in items:
                self.handled.add(rec.episode_id)
                self._published(rec.episode_id, started)

    def _buffers_per_group(self) -> int:
        o = self.objective
        return 1 + int(o.scale_by_std or o.max_groups is not None) + int(self._needs_k())

    def _needs_k(self) -> bool:
        return self.objective.kl_coef != 0.0 and self.objective.dynamic_sampling

    def _open(self, g: GroupState) -> bool:
        if g.H is not None:
            return True
        if not self.pool.fits(self._buffers_per_group()):
            return False
        g.H = self.pool.take()
        if self.objective.scale_by_std or self.objective.max_groups is not None:
            g.R = self.pool.take()
        if self._needs_k():
            g.K = self.pool.take()
        return True

    def _precompute(self, rec: EpisodeRecord) -> None:
        count = 1 + int(self.objective.kl_coef != 0.0)
        if not self.pool.fits(count):
            return
        h, k = self._backward(rec)
        self.pending[rec.episode_id] = (self.pool.take(h), None if k is None else self.pool.take(k))

    def _release_pending(self, eid: str) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        vectors = self.pending.pop(eid, None)
        if vectors is not None:
            self.pool.give(1 + int(vectors[1] is not None))
        return vectors

    def _deposit(self, g: GroupState, rec: EpisodeRecord) -> None:
        if not self._open(g):
            return  # over budget: waits for its group (or keeps its early buffer)
        vectors = self._release_pending(rec.episode_id)
        h, k = vectors if vectors is not None else self._backward(rec)
        assert rec.reward is not None and g.H is not None
        r = rec.reward.reward
        g.shift = r if g.shift is None else g.shift
        (g.R if g.R is not None else self.step_grad).add_(h, alpha=r - g.shift)
        g.H.add_(h)
        if k is not None:
            (g.K if g.K is not None else self.step_grad).add_(k)
        self.handled.add(rec.episode_id)

    def _close(self, g: GroupState) -> None:
        g.closed = True
        kept = g.kept()
        rewards = kept_rewards(kept)
        degenerate = is_degenerate(rewards)
        g.dropped = self.objective.dynamic_sampling and degenerate
        if g.dropped:
            for m in g.members.values():
                self._release_pending(m.episode_id)
                self.handled.add(m.episode_id)
            self._free(g, keep_result=False)
            self._admit_waiting()
            return
        g.stats = group_stats(rewards, self.objective) if not degenerate else (0.0, 1.0)
        if g.H is not None:
            self._fold(g, degenerate)
        for m in kept:
            if m.tokens_ready and m.episode_id not in self.handled:
                self.queue[m.episode_id] = m
        self._admit_waiting()

    def _fold(self, g: GroupState, degenerate: bool) -> None:
        mean, scale = g.stats
        assert g.H is not None and g.shift is not None
        target = self._target(g)
        if g.R is not None:
            if not degenerate:
                g.R.sub_(g.H, alpha=mean - g.shift).div_(scale)
            else:
                g.R.zero_()
            if g.K is not None:
                g.R.add_(g.K)
            if self.objective.max_groups is not None:
                g.result, g.R = g.R, None  # the group's contribution, held until selection
            else:
                target.add_(g.R)
        else:
            if not degenerate:
                target.sub_(g.H, alpha=mean - g.shift)
            if g.K is not None:
                target.add_(g.K)
        self._free(g, keep_result=True)

    def _target(self, g: GroupState) -> torch.Tensor | None:
        """Where the group's contributions go: the step's gradient, or with ``max_groups``
        the group's own result (None when the budget cannot hold one: wait for the step)."""
        if self.objective.max_groups is None:
            return self.step_grad
        if g.result is None and g.R is not None:
            return g.R
        if g.result is None and self.pool.fits(1):
            g.result = self.pool.take()
        return g.result

    def _apply_pending(self, g: GroupState, rec: EpisodeRecord) -> None:
        """Scale an early-start trajectory's held h_i by its now final advantage."""
        if g.dropped:
            self._release_pending(rec.episode_id)
            self.handled.add(rec.episode_id)
            return
        target = self._target(g)
        if target is None:
            return  # held for the step, when the selection is known
        advantage = self._advantage(g, rec)
        vectors = self._release_pending(rec.episode_id)
        assert vectors is not None
        h, k = vectors
        if advantage != 0.0:
            target.add_(h, alpha=advantage)
        if k is not None:
            target.add_(k)
        self.handled.add(rec.episode_id)

    def _advantage(self, g: GroupState, rec: EpisodeRecord) -> float:
        if is_degenerate(kept_rewards(g.kept())):
            return 0.0
        mean, scale = g.stats
        assert rec.reward is not None
        return (rec.reward.reward - mean) / scale

    def _free(self, g: GroupState, *, keep_result: bool) -> None:
        for name in ("R", "H", "K") + (() if keep_result else ("result",)):
            if getattr(g, name) is not None:
                setattr(g, name, None)
                self.pool.give()

    def _admit_waiting(self) -> None:
        """After buffers were freed, open groups whose members wait with rewards known."""
        for g in self.groups.values():
            if g.closed:
                continue
            waiting = [
                m for m in g.members.values()
                if m.episode_id not in self.handled and m.tokens_ready and m.has_reward
                and not m.is_infra_failure
            ]  # fmt: skip
            for m in waiting:
                self.queue[m.episode_id] = m

    def _backward(self, rec: EpisodeRecord) -> tuple[torch.Tensor, torch.Tensor | None]:
        started = ev.now()
        out = grpo_piece(self.policy, self.objective, rec.trajectory(), self.reference)
        self._published(rec.episode_id, started)
        return out

    def _published(self, episode_id: str, started: float) -> None:
        self.num_backward += 1
        if self.publish is not None:
            self.publish(ev.GradientComputed(
                episode_id=episode_id, turn=None, started=started, finished=ev.now()
            ))  # fmt: skip

    # --- the step ----------------------------------------------------------------------------

    def finish(self, selected: list[str]) -> torch.Tensor:
        """The batch's gradient sum over ``selected`` groups (canonical order)."""
        self.drain()
        late = []
        for gid in selected:
            g = self.groups[gid]
            waiting = [m for m in g.kept() if m.episode_id not in self.handled]
            late += [(m, self._advantage(g, m)) for m in waiting]
            if g.result is not None:
                self.step_grad.add_(g.result)
        weighted_grad(
            self.policy, self.objective, late, self.reference,
            micro_batch_size=self.micro_batch_size, total=self.step_grad,
        )  # fmt: skip
        for g in self.groups.values():
            self._free(g, keep_result=False)
        for eid in list(self.pending):
            self._release_pending(eid)
        return self.step_grad
