"""Batch-synchronous gradients: the textbook computation a sync trainer runs after rollout —
advantages first, then padded micro-batches of the whole loss, one backward each."""

from __future__ import annotations

import torch

from thundersync.assembly import EpisodeRecord
from thundersync.gradients import flat_grad
from thundersync.objectives import (
    GRPO,
    OPD,
    group_advantages,
    grpo_terms,
    importance_weights,
    opd_term,
    ppo_clip_loss,
)
from thundersync.policy import Policy


def grpo_batch_grad(
    policy: Policy,
    objective: GRPO,
    groups: dict[str, list[EpisodeRecord]],
    selected: list[str],
    reference: Policy | None,
    *,
    micro_batch_size: int,
    total: torch.Tensor,
) -> torch.Tensor:
    """Σ_i ∇[PPO-clip surrogate of A_i + KL] over the selected groups (before 1/D)."""
    items: list[tuple[EpisodeRecord, float]] = []
    for gid in selected:
        kept = [m for m in groups[gid] if not m.is_infra_failure]
        advantages = group_advantages([m.reward.reward for m in kept], objective)
        items += list(zip(kept, advantages))
    return weighted_grad(
        policy, objective, items, reference, micro_batch_size=micro_batch_size, total=total
    )


def weighted_grad(
    policy: Policy,
    objective: GRPO,
    items: list[tuple[EpisodeRecord, float]],
    reference: Policy | None,
    *,
    micro_batch_size: int,
    total: torch.Tensor,
) -> torch.Tensor:
    """Add Σ_i ∇[PPO-clip surrogate with advantage A_i + KL_i] for (trajectory, A_i) items,
    one padded forward and one backward per micro-batch; items that contribute nothing
    (A = 0 and no KL term) are skipped."""
    items = [(m, a) for m, a in items if a != 0.0 or objective.kl_coef != 0.0]
    for start in range(0, len(items), micro_batch_size):
        chunk = items[start : start + micro_batch_size]
        trajectories = [m.trajectory() for m, _ in chunk]
        logps = policy.batch_action_logprobs(trajectories)
        refs: list[torch.Tensor | None] = [None] * len(chunk)
        if reference is not None and objective.kl_coef != 0.0:
            with torch.no_grad():
                refs = list(reference.batch_action_logprobs(trajectories))
        loss = torch.zeros((), dtype=policy.dtype, device=policy.device)
        for (_, advantage), traj, logp_T, ref_T in zip(chunk, trajectories, logps, refs):
            sampler_T = torch.tensor(
                [v for t in traj.turns for v in t.action_logprobs],
                dtype=logp_T.dtype, device=logp_T.device,
            )  # fmt: skip
            rho_T = importance_weights(logp_T, sampler_T, objective.tis_cap)
            # On-policy sync: π_old is the learner itself before the step (ratio exactly 1).
            loss = loss + ppo_clip_loss(objective, logp_T, logp_T.detach(), advantage, rho_T)
            _, kl = grpo_terms(objective, logp_T, sampler_T, ref_T)
            if kl is not None:
                loss = loss + kl
        total.add_(flat_grad(policy.params, loss))
    return total


def opd_batch_grad(
    policy: Policy,
    objective: OPD,
    episodes: list[EpisodeRecord],
    *,
    micro_batch_size: int,
    total: torch.Tensor,
) -> torch.Tensor:
    """Σ_i ∇(−Σ_t w_t Â_t log π_θ(a_t)) over whole episodes (before 1/D)."""
    for start in range(0, len(episodes), micro_batch_size):
        trajectories = [rec.trajectory() for rec in episodes[start : start + micro_batch_size]]
        logps = policy.batch_action_logprobs(trajectories)
        loss = torch.zeros((), dtype=policy.dtype, device=policy.device)
        for traj, logp_T in zip(trajectories, logps):
            teacher = [v for turn in traj.turns for v in (turn.teacher_logprobs or ())]
            sampler = [v for turn in traj.turns for v in turn.action_logprobs]
            loss = loss + opd_term(
                objective,
                logp_T,
                torch.tensor(teacher, dtype=logp_T.dtype, device=logp_T.device),
                torch.tensor(sampler, dtype=logp_T.dtype, device=logp_T.device),
                num_episode_tokens=traj.num_action_tokens,
            )
        total.add_(flat_grad(policy.params, loss))
    return total
