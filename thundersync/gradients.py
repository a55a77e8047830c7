"""Gradient pieces: one trajectory's or one turn's backward pass into flat parameter vectors,
and the budgeted pool of parameter-sized buffers that exact streaming accumulates into."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from thundersync.objectives import GRPO, OPD, grpo_terms, opd_term
from thundersync.policy import Policy
from thundersync.types import Trajectory


class BufferPool:
    """Parameter-sized flat buffers with a byte budget and a peak-usage record.

    The step's own gradient is not counted: sync needs it too. What is counted is what
    streaming adds: per-group accumulators and per-trajectory buffers.
    """

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device,
                 budget_bytes: int | None) -> None:  # fmt: skip
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


def grpo_piece(
    policy: Policy,
    objective: GRPO,
    trajectory: Trajectory,
    reference: Policy | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One trajectory's backward pass: (h_i, k_i) = (∇ℓ_i, ∇κ_i), kept apart because h_i is
    scaled by an advantage not known yet (k_i is None without a KL term). Trajectories whose
    advantage is already final go through ``batch.weighted_grad`` instead."""
    logp_T, _ = policy.action_logprobs(trajectory)
    sampler_T = _sampler_logprobs(trajectory, logp_T)
    ref_T = None
    if reference is not None and objective.kl_coef != 0.0:
        with torch.no_grad():
            ref_T, _ = reference.action_logprobs(trajectory)
    pg, kl = grpo_terms(objective, logp_T, sampler_T, ref_T)
    if kl is None:
        return flat_grad(policy.params, pg), None
    return flat_grad(policy.params, pg, retain=True), flat_grad(policy.params, kl)


def opd_piece(
    policy: Policy, objective: OPD, trajectory: Trajectory, turns: Sequence[int]
) -> torch.Tensor:
    """∇ of the OPD term of ``turns`` of one episode, from one forward over the prefix that
    ends with the last of them (a per-turn piece is a prefix forward, so it can run while
    that turn's tool call is still running)."""
    logp_T, turn_T = policy.action_logprobs(trajectory, upto_turn=max(turns))
    wanted = torch.tensor(sorted(turns), device=turn_T.device)
    mask_T = torch.isin(turn_T, wanted)
    teacher = [v for k in sorted(turns) for v in _teacher(trajectory, k)]
    sampler = [v for k in sorted(turns) for v in trajectory.turns[k].action_logprobs]
    dtype = logp_T.dtype
    loss = opd_term(
        objective,
        logp_T[mask_T],
        torch.tensor(teacher, dtype=dtype, device=logp_T.device),
        torch.tensor(sampler, dtype=dtype, device=logp_T.device),
        num_episode_tokens=trajectory.num_action_tokens,
    )
    return flat_grad(policy.params, loss)


def _teacher(trajectory: Trajectory, k: int) -> tuple[float, ...]:
    turn = trajectory.turns[k]
    if turn.teacher_logprobs is None or len(turn.teacher_logprobs) != len(turn.action_ids):
        got = None if turn.teacher_logprobs is None else len(turn.teacher_logprobs)
        raise ValueError(
            f"episode {trajectory.episode_id} turn {k}: teacher_logprobs has {got} values, "
            f"expected {len(turn.action_ids)} (one per action token)"
        )
    return turn.teacher_logprobs


def _sampler_logprobs(trajectory: Trajectory, like: torch.Tensor) -> torch.Tensor:
    values = [v for turn in trajectory.turns for v in turn.action_logprobs]
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def write_grads(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Set each parameter's ``.grad`` from a flat vector (what the optimizer then steps on)."""
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n
