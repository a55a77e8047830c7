"""Batch-synchronous strategies: the textbook computation a sync trainer runs after rollout —
advantages first, then padded micro-batches of the whole loss, one backward each.

``BatchGRPO`` is on-policy: π_old is the learner itself, so the PPO ratio is exactly 1 and
clipping is inactive. ``OffPolicyGRPO`` (``max_staleness > 0``) takes the ratio against the
sampler's log-probs, so ``clip_low``/``clip_high`` act: one optimizer step per batch on PPO's
clipped surrogate with the behaviour policy as π_old. ``BatchOPD`` is sync OPD.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from thundersync.core.canonical import select_groups
from thundersync.core.gradients import (
    flat_grad,
    recorded_terms,
    sampler_logprobs,
    teacher_logprobs,
)
from thundersync.core.micro_batches import length_chunks, weight_classes
from thundersync.core.objectives import (
    GRPO,
    OPD,
    clipped_tokens,
    group_advantages,
    grpo_terms,
    importance_weights,
    opd_term,
    pg_term,
    ppo_clip_loss,
)
from thundersync.core.policy import ActionLogprobs
from thundersync.core.strategy import BatchContext, Groups
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord
from thundersync.protocol.types import Trajectory

Item = TypeVar("Item")


class _AtTheStep:
    """A sync strategy: nothing happens before the step."""

    def __init__(self, ctx: BatchContext, objective: Any) -> None:
        self.ctx, self.objective = ctx, objective

    def on_event(self, event: ev.Event, rec: EpisodeRecord) -> None:
        """Sync waits for the step."""

    def drain(self) -> None:
        """Sync waits for the step."""


class BatchGRPO(_AtTheStep):
    """GRPO, sync, on-policy: the textbook batched computation at the step."""

    against_sampler = False

    def finish(self, groups: Groups) -> tuple[torch.Tensor, list[EpisodeRecord]]:
        items = advantage_items(groups, select_groups(groups, self.objective), self.objective)
        total = weighted_grad(
            self.ctx,
            self.objective,
            items,
            total=self.ctx.pool.zeros(),
            against_sampler=self.against_sampler,
        )
        return total, [m for m, _ in items]


class OffPolicyGRPO(BatchGRPO):
    """GRPO, sync, with tokens up to ``max_staleness`` versions old: PPO-clip against the
    sampler's log-probs (decoupled from the learner's own π_old, which is θ itself)."""

    against_sampler = True


class BatchOPD(_AtTheStep):
    """OPD, sync: every episode's whole term at the step, in padded micro-batches."""

    def finish(self, groups: Groups) -> tuple[torch.Tensor, list[EpisodeRecord]]:
        episodes = opd_episodes(groups)
        total = opd_batch_grad(self.ctx, self.objective, episodes, total=self.ctx.pool.zeros())
        return total, episodes


def opd_episodes(groups: Groups) -> list[EpisodeRecord]:
    """The episodes OPD trains on: all with actions, in canonical order. OPD uses no reward,
    so an infra-failure flag does not exclude an episode whose tokens and scores are known."""
    return [m for members in groups.values() for m in members if m.num_turns]


def advantage_items(
    groups: Groups, selected: list[str], objective: GRPO
) -> list[tuple[EpisodeRecord, float]]:
    """(episode, A_i) for the selected groups; infra failures are dropped from their group
    and the group's statistics are over the rest."""
    items: list[tuple[EpisodeRecord, float]] = []
    for gid in selected:
        kept = [m for m in groups[gid] if not m.is_infra_failure]
        items += list(zip(kept, group_advantages([m.reward_value for m in kept], objective)))
    return items


def micro_batches(
    items: list[Item], records: list[EpisodeRecord], size: int
) -> list[tuple[list[Item], list[Trajectory]]]:
    """``items`` (one per record of ``records``) in padded micro-batches, each with its
    records' trajectories: shortest first, at most ``size`` rows, none more than twice as long
    as its first (``micro_batches.length_chunks``), so that little is computed on padding."""
    trajectories = [record.trajectory() for record in records]
    lengths = [trajectory.context_length() for trajectory in trajectories]
    return [
        ([items[i] for i in chunk], [trajectories[i] for i in chunk])
        for chunk in length_chunks(lengths, size)
    ]


def weighted_grad(
    ctx: BatchContext,
    objective: GRPO,
    items: list[tuple[EpisodeRecord, float]],
    *,
    total: torch.Tensor,
    against_sampler: bool = False,
) -> torch.Tensor:
    """Add Σ_i ∇[PPO-clip surrogate with advantage A_i + KL_i] for (trajectory, A_i) items,
    one padded forward and one backward per micro-batch; items that contribute nothing
    (A = 0 and no KL term) are skipped. Each micro-batch's time goes into ``ctx.pace``, where
    there is one (``thundersync.core.holds``)."""
    items = [(m, a) for m, a in items if a != 0.0 or objective.kl_coef != 0.0]
    for chunk, trajectories in micro_batches(items, [m for m, _ in items], ctx.micro_batch_size):
        started = time.perf_counter()
        logps, refs = _forwards(ctx, objective, trajectories)
        loss = torch.zeros((), dtype=ctx.policy.dtype, device=ctx.policy.device)
        for (_, advantage), traj, logp, ref_T in zip(chunk, trajectories, logps, refs):
            pg, kl = _grpo_loss(ctx, objective, traj, logp, ref_T, advantage, against_sampler)
            loss = loss + pg
            if kl is not None:
                loss = loss + kl
        total.add_(flat_grad(ctx.policy.params, loss))
        if ctx.pace is not None:
            tokens = sum(traj.context_length() for traj in trajectories)
            ctx.pace.note(time.perf_counter() - started, tokens)
    return total


def piece_sums(
    ctx: BatchContext,
    objective: GRPO,
    items: list[tuple[EpisodeRecord, float]],
    *,
    weighted: torch.Tensor | None,
    pieces: torch.Tensor | None,
    kl: torch.Tensor | None,
) -> None:
    """For (trajectory i, cᵢ) items of one open group, add Σ cᵢhᵢ to ``weighted``, Σ hᵢ to
    ``pieces`` and Σ kᵢ to ``kl`` (hᵢ, kᵢ: ``gradients.grpo_piece``'s, on-policy), each sum
    whose target is not None, in padded micro-batches (one forward each), each pass's items
    published as one piece of work. Trajectories of one weight share a backward for both
    Σ cᵢhᵢ and Σ hᵢ (``micro_batches.weight_classes``): a pass/fail group's deposit takes a
    backward per micro-batch for them and one for the KL term, where mixed weights take a
    backward per sum; ``grpo_piece`` takes a forward and one or two backwards per
    trajectory. The same sums, in another floating-point order. ``weighted`` alone (the
    second half of early start's split, whose first half recorded the tokens' statistics and
    the KL term) skips the items with cᵢ = 0, takes no reference forward and records
    nothing."""
    second_half = pieces is None and kl is None
    if second_half:
        items = [(rec, weight) for rec, weight in items if weight != 0.0]
    if weighted is None or second_half:  # one sum of hᵢ, or of cᵢhᵢ: one pass
        classes: list[tuple[list[int], float | None]] = [(list(range(len(items))), None)]
    else:
        classes = weight_classes([weight for _, weight in items])
    for indices, shared in classes if items else []:
        members = [items[i] for i in indices]
        started = ev.now()
        for chunk, trajectories in micro_batches(
            members, [m for m, _ in members], ctx.micro_batch_size
        ):
            _sum_chunk(ctx, objective, chunk, trajectories, shared, weighted, pieces, kl)
        for rec, _ in members:
            ctx.published(rec.episode_id, None, started)


def _sum_chunk(
    ctx: BatchContext,
    objective: GRPO,
    chunk: list[tuple[EpisodeRecord, float]],
    trajectories: list[Trajectory],
    shared: float | None,
    weighted: torch.Tensor | None,
    pieces: torch.Tensor | None,
    kl: torch.Tensor | None,
) -> None:
    """One micro-batch of ``piece_sums``: a padded forward and its backwards (a sum each, or
    with a ``shared`` weight one backward for Σ hᵢ into ``pieces`` and ``shared`` times it
    into ``weighted``)."""
    second_half = pieces is None and kl is None
    if second_half:
        logps = ctx.policy.batch_action_logprobs(trajectories)
        refs: list[torch.Tensor | None] = [None] * len(trajectories)
    else:
        logps, refs = _forwards(ctx, objective, trajectories)
    zero = torch.zeros((), dtype=ctx.policy.dtype, device=ctx.policy.device)
    weighted_loss, piece_loss, kl_loss = zero, zero, zero
    for (_, weight), traj, logp, ref_T in zip(chunk, trajectories, logps, refs):
        if second_half:
            sampler_T = sampler_logprobs(traj, logp.logp_T)
            pg, kl_term = pg_term(objective, logp.logp_T, sampler_T), None
        else:
            pg, kl_term = recorded_terms(
                objective, ctx.stats, traj, logp.logp_T, logp.entropy_T, ref_T
            )
        weighted_loss = weighted_loss + weight * pg
        piece_loss = piece_loss + pg
        if kl_term is not None:
            kl_loss = kl_loss + kl_term
    if shared is not None and pieces is not None:  # Σ cᵢhᵢ is ``shared`` times Σ hᵢ
        sums = [(pieces, piece_loss, shared), (kl, kl_loss, 0.0)]
    else:
        sums = [(weighted, weighted_loss, 0.0), (pieces, piece_loss, 0.0), (kl, kl_loss, 0.0)]
    kept = [(target, loss, also) for target, loss, also in sums if target is not None]
    for n, (target, loss, also) in enumerate(kept):
        grad = flat_grad(ctx.policy.params, loss, retain=n + 1 < len(kept))
        target.add_(grad)
        if also != 0.0 and weighted is not None:
            weighted.add_(grad, alpha=also)


def _forwards(
    ctx: BatchContext, objective: GRPO, trajectories: list[Trajectory]
) -> tuple[list[ActionLogprobs], list[torch.Tensor | None]]:
    """The policy's padded forward of ``trajectories`` and, where the objective has a KL term,
    the reference's (without gradients)."""
    logps = ctx.policy.batch_action_logprobs(trajectories)
    refs: list[torch.Tensor | None] = [None] * len(trajectories)
    if ctx.reference is not None and objective.kl_coef != 0.0:
        with torch.no_grad():
            refs = [out.logp_T for out in ctx.reference.batch_action_logprobs(trajectories)]
    return logps, refs


def _grpo_loss(
    ctx: BatchContext,
    objective: GRPO,
    traj: Trajectory,
    logp: ActionLogprobs,
    ref_T: torch.Tensor | None,
    advantage: float,
    against_sampler: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One trajectory's PPO-clip surrogate and KL term."""
    logp_T = logp.logp_T
    sampler_T = sampler_logprobs(traj, logp_T)
    if against_sampler:
        old_T, rho_T = sampler_T, torch.ones_like(logp_T)
        clipped_T = clipped_tokens(objective, torch.exp(logp_T.detach() - sampler_T), advantage)
    else:
        # On-policy: π_old is the learner itself before the step (ratio exactly 1).
        old_T, clipped_T = logp_T.detach(), None
        rho_T = importance_weights(logp_T, sampler_T, objective.tis_cap)
    pg = ppo_clip_loss(objective, logp_T, old_T, advantage, rho_T)
    reinforce, kl = grpo_terms(objective, logp_T, sampler_T, ref_T)
    # The loss metric: on-policy, ℓ_i (REINFORCE form, same gradient as the surrogate whose
    # value is −A Σw at ratio 1), as streaming reports it; off-policy, the PPO surrogate.
    value = {"loss": pg} if against_sampler else {"pg": reinforce}
    ctx.stats.record(
        (traj.episode_id, None),
        logp_T,
        sampler_T,
        clipped_T,
        ref_T=ref_T,
        kl=kl,
        entropy_T=logp.entropy_T,
        **value,
    )
    return pg, kl


def opd_batch_grad(
    ctx: BatchContext,
    objective: OPD,
    episodes: list[EpisodeRecord],
    *,
    total: torch.Tensor,
    turns: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """Add Σ_i ∇(−Σ_t w_t Â_t log π_θ(a_t)) over whole episodes (before 1/D), in padded
    micro-batches; with ``turns``, over the tokens of ``turns[i]`` of episode i only, each row
    the prefix that ends with the last of them (so a turn's piece runs while its tool call
    does: ``core/distill.py``)."""
    wanted = [None] * len(episodes) if turns is None else [sorted(ks) for ks in turns]
    trajectories = [
        rec.trajectory(None if ks is None else ks[-1]) for rec, ks in zip(episodes, wanted)
    ]
    lengths = [trajectory.context_length() for trajectory in trajectories]
    for chunk in length_chunks(lengths, ctx.micro_batch_size):
        rows = [trajectories[i] for i in chunk]
        logps = ctx.policy.batch_action_logprobs(rows)
        loss = torch.zeros((), dtype=ctx.policy.dtype, device=ctx.policy.device)
        for i, traj, (logp_T, turn_T, entropy_T) in zip(chunk, rows, logps):
            ks = wanted[i]
            if ks is not None:
                mask_T = torch.isin(turn_T, torch.tensor(ks, device=turn_T.device))
                logp_T, entropy_T = logp_T[mask_T], entropy_T[mask_T]
            sampler_T = sampler_logprobs(traj, logp_T, ks)
            term = opd_term(
                objective,
                logp_T,
                teacher_logprobs(traj, range(len(traj.turns)) if ks is None else ks, logp_T),
                sampler_T,
                num_episode_tokens=traj.num_action_tokens,
            )
            key = (traj.episode_id, None if ks is None else ks[0])
            ctx.stats.record(key, logp_T, sampler_T, loss=term, entropy_T=entropy_T)
            loss = loss + term
        total.add_(flat_grad(ctx.policy.params, loss))
    return total
