"""Canonical-order reduction: group selection, and the deterministic GRPO strategy that sync
and streaming share so that both perform the very same floating-point operations
(docs/design.md §3).

Pieces (a trajectory's h_i and k_i, or one OPD turn's gradient) may be computed in any order
and at any time: the parameters do not change within a batch, so a piece is bitwise the same
whenever it is computed. Only the order of the sums matters, and here it is fixed: groups by
natural group id, episodes by natural episode id, turns in order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable

import torch

from thundersync.core.gradients import BufferPool, Piece, grpo_piece
from thundersync.core.objectives import GRPO, group_stats, is_degenerate
from thundersync.core.strategy import BatchContext, Groups, begin_group
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord


def select_groups(groups: Groups, objective: GRPO) -> list[str]:
    """The groups a sync trainer trains on, in canonical order: dynamic sampling drops the
    groups whose (non-infra) rewards are all equal and keeps the first ``max_groups``."""
    selected: list[str] = []
    for gid, members in groups.items():
        rewards = [m.reward_value for m in members if m.has_reward and not m.is_infra_failure]
        if objective.dynamic_sampling and is_degenerate(rewards):
            continue
        if objective.max_groups is not None and len(selected) >= objective.max_groups:
            break
        selected.append(gid)
    return selected


class PieceStore:
    """Pieces computed early, held within a byte budget; a piece that does not fit is
    computed when the reduction asks for it."""

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self.pieces: dict[Hashable, tuple[torch.Tensor, ...]] = {}

    def has(self, key: Hashable) -> bool:
        return key in self.pieces

    def offer(self, key: Hashable, count: int, compute: Callable[[], tuple]) -> None:
        """Compute and hold the piece for ``key`` if ``count`` buffers fit the budget."""
        if key in self.pieces or not self.pool.fits(count):
            return
        vectors = tuple(v for v in compute() if v is not None)
        self.pieces[key] = tuple(self.pool.take(v) for v in vectors)

    def get(self, key: Hashable, compute: Callable[[], tuple]) -> tuple:
        if key in self.pieces:
            vectors = self.pieces.pop(key)
            self.pool.give(len(vectors))
            return vectors
        return tuple(v for v in compute() if v is not None)

    def discard(self, key: Hashable) -> None:
        vectors = self.pieces.pop(key, None)
        if vectors is not None:
            self.pool.give(len(vectors))

    def clear(self) -> None:
        for key in list(self.pieces):
            self.discard(key)


def reduce_grpo(
    groups: Groups,
    selected: list[str],
    objective: GRPO,
    piece: Callable[[EpisodeRecord], Piece],
    total: torch.Tensor,
) -> torch.Tensor:
    """Σ over selected groups of ( W_g − (μ_g − c) H_g ) / s_g + Σ k_i, in canonical order,
    with W_g = Σ (r_i − c) h_i (the shifted reward-weighted sum), H_g = Σ h_i and c the
    group's first reward."""
    for gid in selected:
        begin_group(total, gid)
        kept = [m for m in groups[gid] if not m.is_infra_failure]
        rewards = [m.reward_value for m in kept]
        degenerate = is_degenerate(rewards)
        shift = rewards[0] if rewards else 0.0
        weighted_sum: torch.Tensor | None = None
        piece_sum: torch.Tensor | None = None
        for m, r in zip(kept, rewards):
            h, k = piece(m)
            if not degenerate:
                if weighted_sum is None or piece_sum is None:
                    weighted_sum, piece_sum = torch.zeros_like(h), torch.zeros_like(h)
                weighted_sum.add_(h, alpha=r - shift)
                piece_sum.add_(h)
            if k is not None:
                total.add_(k)
        if weighted_sum is not None and piece_sum is not None:
            mean, scale = group_stats(rewards, objective)
            total.add_(weighted_sum.sub_(piece_sum, alpha=mean - shift).div_(scale))
    return total


class CanonicalGRPO:
    """Deterministic GRPO, one strategy for sync and streaming: per-trajectory pieces reduced
    by ``reduce_grpo``. Streaming (``precompute``) computes a trajectory's piece once its
    tokens are known, within the buffer budget; sync computes every piece at the step."""

    def __init__(self, ctx: BatchContext, objective: GRPO, *, precompute: bool) -> None:
        self.ctx, self.objective, self.precompute = ctx, objective, precompute
        self.store = PieceStore(ctx.pool)
        self.unblocked: dict[str, EpisodeRecord] = {}
        self.group_members: dict[str, dict[str, EpisodeRecord]] = {}
        self.dropped_groups: set[str] = set()

    def on_event(self, event: ev.Event, rec: EpisodeRecord) -> None:
        if not self.precompute or rec.started is None:
            return
        gid = rec.started.group_id
        self.group_members.setdefault(gid, {})[rec.episode_id] = rec
        if rec.is_infra_failure:
            self.store.discard(rec.episode_id)
            self.unblocked.pop(rec.episode_id, None)
        elif rec.tokens_ready and not self.store.has(rec.episode_id):
            self.unblocked[rec.episode_id] = rec
        self._drop_if_degenerate(gid, rec.started.group_size)

    def drain(self) -> None:
        count = 1 + int(self.objective.kl_coef != 0.0)
        ready, self.unblocked = list(self.unblocked.values()), {}
        for rec in ready:
            if rec.group_id not in self.dropped_groups and not rec.is_infra_failure:
                self.store.offer(rec.episode_id, count, functools.partial(self._piece, rec))

    def finish(self, groups: Groups) -> tuple[torch.Tensor, list[EpisodeRecord]]:
        selected = select_groups(groups, self.objective)

        def piece(m: EpisodeRecord) -> Piece:
            vectors = self.store.get(m.episode_id, lambda: self._piece(m))
            return vectors[0], (vectors[1] if len(vectors) > 1 else None)

        total = reduce_grpo(groups, selected, self.objective, piece, self.ctx.step_sum())
        self.store.clear()
        trained = [m for g in selected for m in groups[g] if not m.is_infra_failure]
        return total, trained

    def _piece(self, rec: EpisodeRecord) -> Piece:
        started, ctx = ev.now(), self.ctx
        piece = grpo_piece(ctx.policy, self.objective, rec.trajectory(), ctx.reference, ctx.stats)
        ctx.published(rec.episode_id, None, started)
        return piece

    def _drop_if_degenerate(self, gid: str, size: int) -> None:
        """Dynamic sampling: free the pieces of a group it drops, once all rewards are in."""
        members = self.group_members[gid]
        if not self.objective.dynamic_sampling or gid in self.dropped_groups:
            return
        if len(members) < size or not all(m.has_reward for m in members.values()):
            return
        rewards = [m.reward_value for m in members.values() if not m.is_infra_failure]
        if is_degenerate(rewards):
            self.dropped_groups.add(gid)
            for eid in members:
                self.store.discard(eid)
                self.unblocked.pop(eid, None)
