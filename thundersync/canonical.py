"""Canonical-order reduction: group selection, and the deterministic mode that sync and
streaming share so that both perform the very same floating-point operations (DESIGN §3).

Pieces (a trajectory's h_i and k_i, or one OPD turn's gradient) may be computed in any order
and at any time: the parameters do not change within a batch, so a piece is bitwise the same
whenever it is computed. Only the order of the sums matters, and here it is fixed: groups by
natural group id, episodes by natural episode id, turns in order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from thundersync.assembly import EpisodeRecord
from thundersync.gradients import BufferPool
from thundersync.objectives import GRPO, group_stats, is_degenerate

Piece = tuple[torch.Tensor, torch.Tensor | None]


def select_groups(groups: dict[str, list[EpisodeRecord]], objective: GRPO) -> list[str]:
    """The groups a sync trainer trains on, in canonical order: dynamic sampling drops the
    groups whose (non-infra) rewards are all equal and keeps the first ``max_groups``."""
    selected = []
    for gid, members in groups.items():
        rewards = [m.reward.reward for m in members if m.reward and not m.is_infra_failure]
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
    groups: dict[str, list[EpisodeRecord]],
    selected: list[str],
    objective: GRPO,
    piece: Callable[[EpisodeRecord], Piece],
    total: torch.Tensor,
) -> torch.Tensor:
    """Σ over selected groups of ( R_g − (μ_g − c) H_g ) / s_g + Σ k_i, in canonical order,
    with R_g = Σ (r_i − c) h_i, H_g = Σ h_i and c the group's first reward."""
    for gid in selected:
        kept = [m for m in groups[gid] if not m.is_infra_failure]
        rewards = [m.reward.reward for m in kept if m.reward is not None]
        degenerate = is_degenerate(rewards)
        R = H = None
        for m, r in zip(kept, rewards):
            h, k = piece(m)
            if not degenerate:
                if R is None:
                    shift = r
                    R, H = torch.zeros_like(h), torch.zeros_like(h)
                R.add_(h, alpha=r - shift)
                H.add_(h)
            if k is not None:
                total.add_(k)
        if R is not None and H is not None:
            mean, scale = group_stats(rewards, objective)
            total.add_(R.sub_(H, alpha=mean - shift).div_(scale))
    return total
