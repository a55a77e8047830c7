"""Exact streaming GRPO: per-trajectory backward passes folded into per-group accumulators.

For group g with rewards r_i, shift c (the first reward deposited) and h_i = ∇ℓ_i:

    Σ_i A_i h_i = ( W_g − (μ_g − c) H_g ) / s_g,   W_g = Σ (r_i − c) h_i,   H_g = Σ h_i

which is docs/design.md §3's (R − μH)/(σ+ε) with the rewards shifted by c: the same value, less
cancellation, and a group whose rewards are all equal deposits exact zeros (r_i − c = 0).
Without std scaling (s = 1) W_g needs no buffer: (r_i − c) h_i goes straight into the
step's gradient, so a group costs one buffer. A trajectory whose group is already closed is
processed with its final advantage directly (batched, no buffer); so is every member of a
group that could not open within the buffer budget: exact, just later. Rewarded trajectories
of one open group that a drain finds together are deposited in batched passes
(``batch.piece_sums``: the three sums; trajectories of one reward share the backward of the
first two, so a pass/fail group's deposit takes a backward per micro-batch, and one more for
the KL term).

Early start (a trajectory's work at ``EpisodeCompleted``, before its reward) splits that work
in two: what does not depend on the reward, hᵢ into H_g and kᵢ (the KL term's gradient) into
its target, runs at completion; (rᵢ − c) hᵢ into W_g runs at the reward, one forward and one
backward (none where rᵢ = c). So the accumulators stay one set per open group. A
trajectory's whole (hᵢ, kᵢ) is held to its reward instead, with nothing left to do then, only
where the buffer budget (``--buffer-budget-bytes``, else 2 · groups + 1 copies) has room for it
besides every open group's accumulators (docs/design.md §3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from thundersync.core.assembly import natural_key
from thundersync.core.batch import piece_sums, weighted_grad
from thundersync.core.canonical import select_groups
from thundersync.core.gradients import Piece, grpo_piece
from thundersync.core.holds import next_deposit
from thundersync.core.objectives import GRPO, group_stats, is_degenerate
from thundersync.core.strategy import BatchContext, Groups
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord
from thundersync.protocol.errors import InvariantError


@dataclass(slots=True)
class GroupState:
    """One group's accumulators while it is open, and its statistics once it closes."""

    group_id: str
    size: int
    members: dict[str, EpisodeRecord] = field(default_factory=dict)
    weighted_sum: torch.Tensor | None = None
    """W_g = Σ (r_i − c) h_i (None without std scaling: it goes to the step's gradient)."""
    piece_sum: torch.Tensor | None = None
    """H_g = Σ h_i."""
    kl_sum: torch.Tensor | None = None
    """Σ k_i, held only when dynamic sampling may still drop the group."""
    contribution: torch.Tensor | None = None
    """With ``max_groups``: the closed group's whole term, held until the selection is known."""
    shift: float | None = None
    closed: bool = False
    dropped: bool = False
    stats: tuple[float, float] = (0.0, 1.0)

    def unrewarded(self) -> int:
        return self.size - sum(m.has_reward for m in self.members.values())

    def kept(self) -> list[EpisodeRecord]:
        live = [m for m in self.members.values() if not m.is_infra_failure]
        return sorted(live, key=lambda m: natural_key(m.episode_id))

    def kept_rewards(self) -> list[float]:
        return [m.reward_value for m in self.kept() if m.has_reward]


class StreamingGRPO:
    """Streaming GRPO for one batch (see the module docstring)."""

    def __init__(self, ctx: BatchContext, objective: GRPO, *, early_start: bool) -> None:
        self.ctx, self.objective, self.early_start = ctx, objective, early_start
        self.groups: dict[str, GroupState] = {}
        self.group_of: dict[str, GroupState] = {}
        self.unblocked: dict[str, EpisodeRecord] = {}
        """Episodes with work to run at the next ``drain``."""
        self.early_pieces: dict[str, Piece] = {}
        """(h_i, k_i) computed at ``EpisodeCompleted`` (early start), waiting for the reward."""
        self.halved: set[str] = set()
        """Early start's split: episodes whose h_i is in H_g and k_i in its target, their
        (r_i − c) h_i still to come at the reward."""
        self.remainders: list[tuple[GroupState, EpisodeRecord, float]] = []
        """Split episodes of groups closed since the last drain, with their (rᵢ − c) / s_g."""
        self.accounted: set[str] = set()
        """Episodes whose contribution is in (or that contribute nothing)."""
        self.deferred = False  # the last drain left deposits for the next (core.holds)
        self.held: dict[str, tuple[float, float]] = {}
        """Open groups whose deposits are held, (since, until) (``Pace.hold``)."""
        self._total: torch.Tensor | None = None

    # --- event-driven work -------------------------------------------------------------------

    def on_event(self, event: ev.Event, rec: EpisodeRecord) -> None:
        """Note what ``rec``'s new event unblocked; the work itself runs in ``drain``."""
        if rec.started is None:
            return
        gid, eid = rec.started.group_id, rec.episode_id
        g = self.groups.setdefault(gid, GroupState(gid, rec.started.group_size))
        g.members[eid] = rec
        self.group_of[eid] = g
        if eid not in self.accounted:
            if rec.is_infra_failure:
                self._release_early(eid)
                self._retract(g, rec)
                self.accounted.add(eid)
                self.unblocked.pop(eid, None)
            elif rec.tokens_ready and (rec.has_reward or g.closed or self.early_start):
                self.unblocked[eid] = rec
        if not g.closed and g.unrewarded() <= 0:
            self._close(g)

    def drain(self) -> None:
        """Run the unblocked work. Trajectories of closed groups have final advantages and are
        batched (one padded backward per micro-batch, like sync); rewarded trajectories of an
        open group are deposited into its accumulators, together when there are several
        (``_deposit``), unless held for the group's close (``_holds``) or, where the caller
        comes back (``wake_after``), left for the next drain (``thundersync.core.holds``)."""
        self._drain(hold=True)

    def wake_after(self) -> float | None:
        """Seconds until the first held deposit may no longer wait (0.0: now, or deposits
        left for the next drain); None when nothing is held."""
        if self.deferred:
            return 0.0
        if not self.held:
            return None
        return max(0.0, min(until for _, until in self.held.values()) - time.monotonic())

    def _drain(self, *, hold: bool) -> None:
        finals: list[tuple[GroupState, EpisodeRecord]] = []
        deposits: dict[str, list[EpisodeRecord]] = {}
        early: list[EpisodeRecord] = []
        unblocked, self.unblocked = list(self.unblocked.values()), {}
        for rec in unblocked:
            eid = rec.episode_id
            g = self.group_of[eid]
            if eid in self.accounted:
                continue
            if g.closed and eid in self.early_pieces:
                self._apply_early(g, rec)
            elif g.closed:
                finals.append((g, rec))
            elif rec.has_reward:
                deposits.setdefault(g.group_id, []).append(rec)
            elif self.early_start and eid not in self.early_pieces and eid not in self.halved:
                early.append(rec)
        held, self.held = self.held, {}  # a group stays held only while deposits wait
        ready: dict[str, list[EpisodeRecord]] = {}
        for gid, recs in deposits.items():
            if hold and self._holds(self.groups[gid], recs, held.get(gid)):
                self.unblocked.update((rec.episode_id, rec) for rec in recs)
            else:
                ready[gid] = recs
        self.deferred = False
        if ready and hold and self.ctx.pace is not None:  # one thing per drain (core.holds)
            unrewarded = {gid: self.groups[gid].unrewarded() for gid in ready}
            first = () if finals or self.remainders else (next_deposit(unrewarded),)
            self.deferred = len(ready) > len(first)
            for gid in [gid for gid in unrewarded if gid not in first]:
                self.unblocked.update((rec.episode_id, rec) for rec in ready.pop(gid))
        for gid, recs in ready.items():
            self._deposit(self.groups[gid], recs)
        halves: dict[str, list[EpisodeRecord]] = {}
        for rec in early:  # held whole where the budget has room, else split
            if not self._precompute(rec):
                halves.setdefault(self.group_of[rec.episode_id].group_id, []).append(rec)
        for gid, recs in halves.items():
            self._first_half(self.groups[gid], recs)
        self._run_remainders()
        self._run_finals(finals)

    def _holds(
        self, g: GroupState, recs: list[EpisodeRecord], held: tuple[float, float] | None
    ) -> bool:
        """Whether open group ``g``'s rewarded ``recs`` (none yet accounted for) wait for its
        close, ``held`` its hold so far: only where every member has completed, no rec holds
        early-start work, and the wait is within ``Pace.hold`` (in ``self.held``)."""
        pace = self.ctx.pace
        if pace is None or len(g.members) < g.size:
            return False
        if any(r.episode_id in self.halved or r.episode_id in self.early_pieces for r in recs):
            return False
        if not all(m.tokens_ready or m.is_infra_failure for m in g.members.values()):
            return False
        hold = pace.hold(held, sum(rec.trajectory().context_length() for rec in recs))
        if hold is not None:
            self.held[g.group_id] = hold
        return hold is not None

    def _run_remainders(self) -> None:
        """Closed groups' split episodes: Σ ((rᵢ − c) / s_g) hᵢ into each group's target, one
        batched pass per target (the fold has put W_g and H_g there)."""
        remainders, self.remainders = self.remainders, []
        for g, _, _ in remainders:
            if self._target(g) is None:
                raise InvariantError(f"group {g.group_id!r}: closed with no target")
        for target, items in self._by_target(remainders):
            piece_sums(self.ctx, self.objective, items, weighted=target, pieces=None, kl=None)

    def _by_target(
        self, entries: list[tuple[GroupState, EpisodeRecord, float]]
    ) -> list[tuple[torch.Tensor, list[tuple[EpisodeRecord, float]]]]:
        """(rec, weight) entries grouped by where their groups' contributions go, for one
        batched pass each; a group with no target yet (``max_groups`` over budget: computed at
        the step, once selected) is left out."""
        by_target: dict[int, tuple[torch.Tensor, list]] = {}
        for g, rec, weight in entries:
            target = self._target(g)
            if target is not None:
                by_target.setdefault(id(target), (target, []))[1].append((rec, weight))
        return list(by_target.values())

    def _run_finals(self, finals: list[tuple[GroupState, EpisodeRecord]]) -> None:
        for g, rec in finals:
            if g.dropped:
                self.accounted.add(rec.episode_id)
        kept = [(g, rec, self._advantage(g, rec)) for g, rec in finals if not g.dropped]
        for target, items in self._by_target(kept):
            started = ev.now()
            weighted_grad(self.ctx, self.objective, items, total=target)
            for rec, _ in items:
                self.accounted.add(rec.episode_id)
                self.ctx.published(rec.episode_id, None, started)

    def _step_grad(self) -> torch.Tensor:
        """The step's gradient sum, allocated at first use (nothing outlives a step)."""
        if self._total is None:
            self._total = self.ctx.pool.zeros()
        return self._total

    def _holds_weighted_sum(self) -> bool:
        return self.objective.scale_by_std or self.objective.max_groups is not None

    def _holds_kl_sum(self) -> bool:
        return self.objective.kl_coef != 0.0 and self.objective.dynamic_sampling

    def _open(self, g: GroupState) -> bool:
        if g.piece_sum is not None:
            return True
        if not self.ctx.pool.fits(self._group_buffers()):
            return False
        g.piece_sum = self.ctx.pool.take()
        if self._holds_weighted_sum():
            g.weighted_sum = self.ctx.pool.take()
        if self._holds_kl_sum():
            g.kl_sum = self.ctx.pool.take()
        return True

    def _group_buffers(self) -> int:
        return 1 + int(self._holds_weighted_sum()) + int(self._holds_kl_sum())

    def _precompute(self, rec: EpisodeRecord) -> bool:
        """Hold ``rec``'s whole piece for its reward if the budget has room for it besides
        every open group's accumulators; False if not (it is split: ``_first_half``)."""
        count = 1 + int(self.objective.kl_coef != 0.0)
        pool = self.ctx.pool
        unopened = sum(not g.closed and g.piece_sum is None for g in self.groups.values())
        need = (count + unopened * self._group_buffers()) * pool.buffer_bytes
        cap = pool.budget_bytes
        if cap is None:
            cap = (2 * len(self.groups) + 1) * pool.buffer_bytes
        if pool.bytes_in_use + need > cap:
            return False
        h, k = self._backward(rec)
        self.early_pieces[rec.episode_id] = (pool.take(h), None if k is None else pool.take(k))
        return True

    def _first_half(self, g: GroupState, recs: list[EpisodeRecord]) -> None:
        """Early start's work at completion that needs no reward: Σ hᵢ into H_g and Σ kᵢ into
        its target, one batched pass (if ``g`` can open within the budget; else the
        trajectories wait for their rewards)."""
        if not self._open(g) or g.piece_sum is None:
            return
        piece_sums(
            self.ctx,
            self.objective,
            [(rec, 0.0) for rec in recs],
            weighted=None,
            pieces=g.piece_sum,
            kl=self._kl_target(g) if self.objective.kl_coef != 0.0 else None,
        )
        self.halved.update(rec.episode_id for rec in recs)

    def _retract(self, g: GroupState, rec: EpisodeRecord) -> None:
        """Take a split trajectory that turned out an infrastructure failure back out of H_g
        and the KL target (its piece again: the parameters have not changed)."""
        if rec.episode_id not in self.halved or g.piece_sum is None:
            return
        self.halved.discard(rec.episode_id)
        h, k = self._backward(rec)
        g.piece_sum.sub_(h)
        if k is not None:
            self._kl_target(g).sub_(k)

    def _release_early(self, eid: str) -> Piece | None:
        piece = self.early_pieces.pop(eid, None)
        if piece is not None:
            self.ctx.pool.give(1 + int(piece[1] is not None))
        return piece

    def _deposit(self, g: GroupState, recs: list[EpisodeRecord]) -> None:
        """Add rewarded trajectories of open group ``g``: (rᵢ − c) hᵢ to W_g (or the step's
        gradient), hᵢ to H_g, kᵢ to the KL sum (or the step's gradient). An early piece is
        added as it is; one trajectory without one gets its own backward (``grpo_piece``),
        several share batched passes (``batch.piece_sums``): the same sums."""
        if not self._open(g) or g.piece_sum is None:
            return  # over budget: they wait for their group (or keep their early pieces)
        g.shift = shift = recs[0].reward_value if g.shift is None else g.shift
        pieces = g.piece_sum
        fresh, halved = [], []
        for rec in recs:
            piece = self._release_early(rec.episode_id)
            if rec.episode_id in self.halved:
                halved.append((rec, rec.reward_value - shift))
            elif piece is None:
                fresh.append(rec)
            else:
                self._add_piece(g, pieces, rec.reward_value - shift, piece)
        if halved:  # the reward's half: (rᵢ − c) hᵢ only
            weighted = self._weighted_target(g)
            piece_sums(self.ctx, self.objective, halved, weighted=weighted, pieces=None, kl=None)
        if len(fresh) == 1:
            self._add_piece(g, pieces, fresh[0].reward_value - shift, self._backward(fresh[0]))
        elif fresh:
            piece_sums(
                self.ctx,
                self.objective,
                [(rec, rec.reward_value - shift) for rec in fresh],
                weighted=self._weighted_target(g),
                pieces=pieces,
                kl=self._kl_target(g) if self.objective.kl_coef != 0.0 else None,
            )
        self.accounted.update(rec.episode_id for rec in recs)

    def _add_piece(self, g: GroupState, pieces: torch.Tensor, weight: float, piece: Piece) -> None:
        """One trajectory's (hᵢ, kᵢ) into open group ``g`` (H_g is ``pieces``), hᵢ weighted
        by rᵢ − c into W_g."""
        h, k = piece
        self._weighted_target(g).add_(h, alpha=weight)
        pieces.add_(h)
        if k is not None:
            self._kl_target(g).add_(k)

    def _weighted_target(self, g: GroupState) -> torch.Tensor:
        return g.weighted_sum if g.weighted_sum is not None else self._step_grad()

    def _kl_target(self, g: GroupState) -> torch.Tensor:
        return g.kl_sum if g.kl_sum is not None else self._step_grad()

    def _close(self, g: GroupState) -> None:
        g.closed = True
        self.held.pop(g.group_id, None)
        kept = g.kept()
        rewards = g.kept_rewards()
        degenerate = is_degenerate(rewards)
        g.dropped = self.objective.dynamic_sampling and degenerate
        if g.dropped:
            for m in g.members.values():
                self._release_early(m.episode_id)
                self.accounted.add(m.episode_id)
            self._free(g, keep_contribution=False)
            self._admit_waiting()
            return
        g.stats = group_stats(rewards, self.objective) if not degenerate else (0.0, 1.0)
        split = [
            m for m in kept if m.episode_id in self.halved and m.episode_id not in self.accounted
        ]
        shift = 0.0 if g.shift is None else g.shift  # as the fold reads it
        if g.piece_sum is not None:
            self._fold(g, degenerate)
        for m in split:  # their (rᵢ − c) hᵢ / s_g, batched with other groups' at the drain
            if not degenerate:
                self.remainders.append((g, m, (m.reward_value - shift) / g.stats[1]))
            self.accounted.add(m.episode_id)
        for m in kept:
            if m.tokens_ready and m.episode_id not in self.accounted:
                self.unblocked[m.episode_id] = m
        self._admit_waiting()

    def _fold(self, g: GroupState, degenerate: bool) -> None:
        mean, scale = g.stats
        shift = 0.0 if g.shift is None else g.shift  # None: nothing deposited, buffers are 0
        target = self._target(g)
        if g.weighted_sum is not None and g.piece_sum is not None:
            if not degenerate:
                g.weighted_sum.sub_(g.piece_sum, alpha=mean - shift).div_(scale)
            else:
                g.weighted_sum.zero_()
            if g.kl_sum is not None:
                g.weighted_sum.add_(g.kl_sum)
            if self.objective.max_groups is not None:
                g.contribution, g.weighted_sum = g.weighted_sum, None  # held until selection
            elif target is not None:
                target.add_(g.weighted_sum)
        elif g.piece_sum is not None and target is not None:
            if not degenerate:
                target.sub_(g.piece_sum, alpha=mean - shift)
            if g.kl_sum is not None:
                target.add_(g.kl_sum)
        self._free(g, keep_contribution=True)

    def _target(self, g: GroupState) -> torch.Tensor | None:
        """Where the group's contributions go: the step's gradient, or with ``max_groups``
        the group's own contribution (None when the budget cannot hold one: wait for the step)."""
        if self.objective.max_groups is None:
            return self._step_grad()
        if g.contribution is None and g.weighted_sum is not None:
            return g.weighted_sum
        if g.contribution is None and self.ctx.pool.fits(1):
            g.contribution = self.ctx.pool.take()
        return g.contribution

    def _apply_early(self, g: GroupState, rec: EpisodeRecord) -> None:
        """Scale an early-start trajectory's held h_i by its now final advantage."""
        if g.dropped:
            self._release_early(rec.episode_id)
            self.accounted.add(rec.episode_id)
            return
        target = self._target(g)
        if target is None:
            return  # held for the step, when the selection is known
        advantage = self._advantage(g, rec)
        piece = self._release_early(rec.episode_id)
        if piece is None:
            raise InvariantError(f"episode {rec.episode_id!r}: no early piece to apply")
        h, k = piece
        if advantage != 0.0:
            target.add_(h, alpha=advantage)
        if k is not None:
            target.add_(k)
        self.accounted.add(rec.episode_id)

    def _advantage(self, g: GroupState, rec: EpisodeRecord) -> float:
        if is_degenerate(g.kept_rewards()):
            return 0.0
        mean, scale = g.stats
        return (rec.reward_value - mean) / scale

    def _free(self, g: GroupState, *, keep_contribution: bool) -> None:
        names = ("weighted_sum", "piece_sum", "kl_sum")
        for name in names + (() if keep_contribution else ("contribution",)):
            if getattr(g, name) is not None:
                setattr(g, name, None)
                self.ctx.pool.give()

    def _admit_waiting(self) -> None:
        """After buffers were freed, open groups whose members wait with rewards known."""
        for g in self.groups.values():
            if g.closed:
                continue
            waiting = [
                m
                for m in g.members.values()
                if m.episode_id not in self.accounted
                and m.tokens_ready
                and m.has_reward
                and not m.is_infra_failure
            ]
            for m in waiting:
                self.unblocked[m.episode_id] = m

    def _backward(self, rec: EpisodeRecord) -> Piece:
        started = ev.now()
        ctx = self.ctx
        piece = grpo_piece(ctx.policy, self.objective, rec.trajectory(), ctx.reference, ctx.stats)
        ctx.published(rec.episode_id, None, started)
        return piece

    # --- the step ----------------------------------------------------------------------------

    def finish(self, groups: Groups) -> tuple[torch.Tensor, list[EpisodeRecord]]:
        """The batch's gradient sum over the selected groups (canonical order)."""
        selected = select_groups(groups, self.objective)
        self._drain(hold=False)
        total = self._step_grad()
        late = []
        for gid in selected:
            g = self.groups[gid]
            waiting = [m for m in g.kept() if m.episode_id not in self.accounted]
            late += [(m, self._advantage(g, m)) for m in waiting]
            if g.contribution is not None:
                total.add_(g.contribution)
        weighted_grad(self.ctx, self.objective, late, total=total)
        for g in self.groups.values():
            self._free(g, keep_contribution=False)
        for eid in list(self.early_pieces):
            self._release_early(eid)
        trained = [m for gid in selected for m in groups[gid] if not m.is_infra_failure]
        return total, trained
