"""Gradient pieces: one trajectory's or one turn's backward pass into flat parameter vectors,
and the budgeted pool of parameter-sized buffers that exact streaming accumulates into."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from thundersync.core.learner_metrics import TokenStats
from thundersync.core.objectives import GRPO, OPD, grpo_terms, opd_term
from thundersync.core.policy import Policy
from thundersync.protocol.errors import InvariantError
from thundersync.protocol.types import Trajectory

Piece = tuple[torch.Tensor, torch.Tensor | None]
"""One trajectory's (h_i, k_i): its policy-gradient and KL gradients (k_i None without KL)."""


class BufferPool:
    """Parameter-sized flat buffers with a byte budget and a peak-usage record.

    The step's own gradient is not counted: sync needs it too. What is counted is what
    streaming adds: per-group accumulators and per-trajectory buffers.
    """

    def __init__(
        self, numel: int, dtype: torch.dtype, device: torch.device, budget_bytes: int | None
    ) -> None:
        self.numel, self.dtype, self.device = numel, dtype, device
        self.buffer_bytes = numel * torch.empty((), dtype=dtype).element_size()
        self.budget_bytes = budget_bytes
        self.bytes_in_use = 0
        self.peak_bytes = 0

    def fits(self, count: int) -> bool:
        need = self.bytes_in_use + count * self.buffer_bytes
        return self.budget_bytes is None or need <= self.budget_bytes

    def zeros(self) -> torch.Tensor:
        """A new zero buffer (uncounted: for the step gradient)."""
        return torch.zeros(self.numel, dtype=self.dtype, device=self.device)

    def take(self, vector: torch.Tensor | None = None) -> torch.Tensor:
        """Count ``vector`` (or a new zero buffer) against the budget; caller checked ``fits``."""
        if not self.fits(1):
            raise MemoryError(
                f"buffer budget {self.budget_bytes} B exceeded ({self.bytes_in_use} B in use)"
            )
        self.bytes_in_use += self.buffer_bytes
        self.peak_bytes = max(self.peak_bytes, self.bytes_in_use)
        return self.zeros() if vector is None else vector

    def give(self, count: int = 1) -> None:
        self.bytes_in_use -= count * self.buffer_bytes


def flat_grad(params: Sequence[torch.Tensor], loss: torch.Tensor, *, retain: bool = False):
    """∇loss over ``params`` as one flat vector (zeros for parameters it does not touch)."""
    grads = torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True)
    return torch.cat(
        [(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)]
    )


def recorded_terms(
    objective: GRPO,
    stats: TokenStats,
    trajectory: Trajectory,
    logp_T: torch.Tensor,
    entropy_T: torch.Tensor,
    ref_T: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """On-policy (ℓᵢ, κᵢ) of one trajectory from its log-probs (``grpo_terms``), its tokens'
    statistics recorded in ``stats``."""
    sampler_T = sampler_logprobs(trajectory, logp_T)
    pg, kl = grpo_terms(objective, logp_T, sampler_T, ref_T)
    stats.record(
        (trajectory.episode_id, None),
        logp_T,
        sampler_T,
        ref_T=ref_T,
        pg=pg,
        kl=kl,
        entropy_T=entropy_T,
    )
    return pg, kl


def grpo_piece(
    policy: Policy,
    objective: GRPO,
    trajectory: Trajectory,
    reference: Policy | None,
    stats: TokenStats,
) -> Piece:
    """One trajectory's backward pass: (h_i, k_i) = (∇ℓ_i, ∇κ_i), kept apart because h_i is
    scaled by an advantage not known yet (k_i is None without a KL term). Trajectories whose
    advantage is already final go through ``batch.weighted_grad`` instead."""
    logp_T, _, entropy_T = policy.action_logprobs(trajectory)
    ref_T = None
    if reference is not None and objective.kl_coef != 0.0:
        with torch.no_grad():
            ref_T = reference.action_logprobs(trajectory).logp_T
    pg, kl = recorded_terms(objective, stats, trajectory, logp_T, entropy_T, ref_T)
    if kl is None:
        return flat_grad(policy.params, pg), None
    return flat_grad(policy.params, pg, retain=True), flat_grad(policy.params, kl)


def opd_piece(
    policy: Policy,
    objective: OPD,
    trajectory: Trajectory,
    turns: Sequence[int],
    stats: TokenStats,
    *,
    key: tuple[str, int | None],
) -> torch.Tensor:
    """∇ of the OPD term of ``turns`` of one episode, from one forward over the prefix that
    ends with the last of them (a per-turn piece is a prefix forward, so it can run while
    that turn's tool call is still running)."""
    logp_T, turn_T, entropy_T = policy.action_logprobs(trajectory, upto_turn=max(turns))
    wanted = torch.tensor(sorted(turns), device=turn_T.device)
    mask_T = torch.isin(turn_T, wanted)
    teacher_T = teacher_logprobs(trajectory, sorted(turns), logp_T)
    sampler_T = sampler_logprobs(trajectory, logp_T, sorted(turns))
    loss = opd_term(
        objective,
        logp_T[mask_T],
        teacher_T,
        sampler_T,
        num_episode_tokens=trajectory.num_action_tokens,
    )
    stats.record(key, logp_T[mask_T], sampler_T, loss=loss, entropy_T=entropy_T[mask_T])
    return flat_grad(policy.params, loss)


def teacher_logprobs(
    trajectory: Trajectory, turns: Sequence[int], like: torch.Tensor
) -> torch.Tensor:
    """The teacher's log-probs of ``turns``' action tokens, one per token (the assembler
    refused any other length, so a mismatch here is a bug)."""
    values: list[float] = []
    for k in turns:
        turn = trajectory.turns[k]
        if turn.teacher_logprobs is None or len(turn.teacher_logprobs) != len(turn.action_ids):
            got = None if turn.teacher_logprobs is None else len(turn.teacher_logprobs)
            raise InvariantError(
                f"episode {trajectory.episode_id!r} turn {k}: teacher_logprobs has {got} "
                f"values, expected {len(turn.action_ids)} (one per action token)"
            )
        values.extend(turn.teacher_logprobs)
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def sampler_logprobs(
    trajectory: Trajectory, like: torch.Tensor, turns: Sequence[int] | None = None
) -> torch.Tensor:
    """The sampler's (behaviour) log-probs of the action tokens of ``turns`` (all: None)."""
    chosen = trajectory.turns if turns is None else [trajectory.turns[k] for k in turns]
    values = [v for turn in chosen for v in turn.action_logprobs]
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def write_grads(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Set each parameter's ``.grad`` to its slice of a flat vector, without a second copy of
    the gradient: copied into the existing ``.grad`` when there is one of the right shape and
    dtype (optimizers and hooks holding it keep seeing the same tensor), else a view of
    ``flat`` (whose storage then is the ``.grad``)."""
    offset = 0
    for p in params:
        n = p.numel()
        piece = flat[offset : offset + n].view_as(p)
        grad = p.grad
        if grad is not None and grad.shape == p.shape and grad.dtype == piece.dtype:
            grad.copy_(piece)
        else:
            p.grad = piece
        offset += n
