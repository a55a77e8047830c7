"""Objectives: GRPO and on-policy distillation as pure functions over per-token tensors.

Every objective here is written in the form the exact-streaming learner needs (docs/design.md §3):
the loss gradient of a batch is

    ∇L = (1/D) [ Σ_i A_i ∇ℓ_i + Σ_i ∇κ_i ]

where ``ℓ_i = −Σ_t c_it log π_θ(a_it|s_it)`` is trajectory i's policy-gradient term with
constant per-token coefficients ``c_it``, ``A_i`` its (group) advantage, ``κ_i`` its
group-independent per-token terms (KL to a reference), and ``D`` the batch-wide denominator
(number of sequences or tokens), a scalar applied once at the end.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field

from thundersync.declared import (
    DOCSTRINGS,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    check_fields,
)

LossAgg = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
LOSS_AGGS: tuple[str, ...] = typing.get_args(LossAgg)
ClipLow = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]


@dataclass(frozen=True, slots=True)
class GRPO:
    """Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    On-policy (``Learner(max_staleness=0)``, sync or streaming) the learner takes one optimizer
    step per batch, so the PPO ratio is exactly 1, clipping is inactive, and the update is
    ∇J = Σ_g Σ_{i∈g} A_i Σ_t w_it ρ_it ∇log π_θ(a_it|s_it) with A_i = (r_i − μ_g)/(σ_g + ε).
    ``clip_low``/``clip_high`` then do nothing, by construction. They act with
    ``Learner(max_staleness=k > 0)`` (async): the ratio is then taken against the sampler's
    (behaviour) log-probs, r_t = π_θ(a_t)/π_sampler(a_t), and the surrogate is PPO's
    min(r_t A_i, clip(r_t, 1 − clip_low, 1 + clip_high) A_i) (Schulman et al. 2017).

    Conventions (peers differ, so they are stated): σ_g is the *unbiased* standard deviation
    (``torch.std``, as verl and TRL); a group of one has no baseline and gets advantage 0
    (verl uses the raw reward); a group whose rewards are all equal gets advantage exactly 0
    (not a rounding residue of r − mean(r)); per-sequence means divide by the exact token
    count (verl adds 1e-8).
    """

    __pydantic_config__ = DOCSTRINGS

    loss_agg: LossAgg = "seq-mean-token-mean"
    """``seq-mean-token-mean`` (original GRPO: mean over tokens, then over sequences),
    ``token-mean`` (DAPO, Yu et al. 2025, arXiv:2503.14476: one mean over all tokens of the
    batch), ``seq-mean-token-sum-norm`` (Dr.GRPO, Liu et al. 2025, arXiv:2503.20783: token
    sums divided by the constant ``max_tokens``, mean over sequences)."""
    scale_by_std: bool = True
    """Divide advantages by σ_g + ε (False: Dr.GRPO's unscaled r − μ)."""
    eps: NonNegativeFloat = 1e-6
    """ε in σ_g + ε."""
    max_tokens: PositiveInt = 1024
    """The constant normaliser of ``seq-mean-token-sum-norm``."""
    kl_coef: NonNegativeFloat = 0.0
    """β of the KL-to-reference term (needs a reference model in the learner)."""
    kl_estimator: Literal["k1", "k3"] = "k3"
    """k1 = log π − log π_ref; k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1
    (Schulman 2020, "Approximating KL divergence")."""
    tis_cap: PositiveFloat | None = None
    """Truncated importance sampling for engine-vs-trainer mismatch (Yao et al. 2025):
    ρ_t = min(π_trainer(a_t)/π_engine(a_t), cap), a constant per token. None: ρ = 1.
    On-policy only: with ``max_staleness > 0`` the PPO ratio against the sampler already
    holds π_trainer/π_engine, so the learner refuses a ``tis_cap`` there."""
    clip_low: ClipLow = 0.2
    """PPO clip ε_low. Does nothing on-policy (ratio 1 by construction); acts with
    ``Learner(max_staleness > 0)``, where the ratio is against the sampler's log-probs."""
    clip_high: NonNegativeFloat = 0.2
    """PPO clip ε_high (DAPO's clip-higher uses 0.28). Acts only as ``clip_low`` does."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (DAPO), as sync drops them."""
    max_groups: PositiveInt | None = None
    """With dynamic sampling: keep only the first N informative groups in canonical order."""

    def __post_init__(self) -> None:
        check_fields(self, "GRPO keyword")  # types and ranges, as the annotations declare
        if self.max_groups is not None and not self.dynamic_sampling:
            raise ValueError("max_groups needs dynamic_sampling=True")


@dataclass(frozen=True, slots=True)
class OPD:
    """On-policy distillation (Agarwal et al. 2024, GKD, arXiv:2306.13649; Thinking Machines
    2025, "On-Policy Distillation").

    Per-token advantage Â_t = log π_T(a_t|s_t) − log π_old(a_t|s_t), the negative
    reverse-KL estimate, treated as a constant; ∇J = Σ_t w_t Â_t ∇log π_θ(a_t|s_t).
    π_old is the sampler's log-prob from ``TurnCompleted.action_logprobs``. Turn k's terms
    depend only on the context up to turn k, so they can be computed per turn.
    """

    __pydantic_config__ = DOCSTRINGS

    loss_agg: LossAgg = "token-mean"
    """As GRPO's (``token-mean`` by default)."""
    max_tokens: PositiveInt = 1024
    """The constant normaliser of ``seq-mean-token-sum-norm``."""
    granularity: Literal["turn", "episode", "auto"] = "auto"
    """Per-turn or per-episode gradient work (both exact); ``auto`` picks per episode from
    measured tool latency versus per-turn backward time. ``seq-mean-token-mean`` weights
    need the episode's length, so it always works per episode."""

    def __post_init__(self) -> None:
        check_fields(self, "OPD keyword")  # types and ranges, as the annotations declare


Objective = GRPO | OPD


# --- weights and denominators ----------------------------------------------------------------


def token_weight(loss_agg: LossAgg, num_tokens: int, max_tokens: int) -> float:
    """w_it for every token of a trajectory with ``num_tokens`` action tokens (before 1/D)."""
    if loss_agg == "seq-mean-token-mean":
        return 1.0 / num_tokens
    if loss_agg == "token-mean":
        return 1.0
    return 1.0 / max_tokens


def denominator(loss_agg: LossAgg, token_counts: Sequence[int]) -> float:
    """D: the number of sequences, or of tokens for ``token-mean``; applied once per batch."""
    if loss_agg == "token-mean":
        return float(sum(token_counts))
    return float(len(token_counts))


# --- advantages --------------------------------------------------------------------------------


def is_degenerate(rewards_G: Sequence[float]) -> bool:
    """True when the group carries no signal: one member, or all rewards equal."""
    return len(rewards_G) < 2 or min(rewards_G) == max(rewards_G)


def group_stats(rewards_G: Sequence[float], objective: GRPO) -> tuple[float, float]:
    """(μ_g, s_g) with A_i = (r_i − μ_g)/s_g; s_g = σ_g + ε, or 1 without std scaling."""
    rewards = torch.tensor(list(rewards_G), dtype=torch.float64)
    mean = float(rewards.mean())
    if not objective.scale_by_std:
        return mean, 1.0
    return mean, float(rewards.std(unbiased=True)) + objective.eps


def group_advantages(rewards_G: Sequence[float], objective: GRPO) -> list[float]:
    """A_i for a whole group; exactly 0 for a degenerate group (see ``is_degenerate``)."""
    if is_degenerate(rewards_G):
        return [0.0] * len(rewards_G)
    mean, scale = group_stats(rewards_G, objective)
    return [(r - mean) / scale for r in rewards_G]


# --- per-token coefficients -----------------------------------------------------------------


def importance_weights(
    logp_T: torch.Tensor, sampler_logp_T: torch.Tensor, cap: float | None
) -> torch.Tensor:
    """ρ_t = min(exp(log π_trainer − log π_engine), cap), detached; ones without a cap."""
    if cap is None:
        return torch.ones_like(logp_T)
    return torch.exp(logp_T.detach() - sampler_logp_T).clamp(max=cap)


def kl_penalty(logp_T: torch.Tensor, ref_logp_T: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate (k1 or k3), differentiable in ``logp_T``."""
    if estimator == "k1":
        return logp_T - ref_logp_T
    log_ratio = ref_logp_T - logp_T
    return torch.exp(log_ratio) - log_ratio - 1.0


def pg_term(objective: GRPO, logp_T: torch.Tensor, sampler_logp_T: torch.Tensor) -> torch.Tensor:
    """ℓ_i alone: ``grpo_terms``'s policy-gradient term."""
    weight = token_weight(objective.loss_agg, logp_T.numel(), objective.max_tokens)
    rho_T = importance_weights(logp_T, sampler_logp_T, objective.tis_cap)
    return -(weight * rho_T * logp_T).sum()


def grpo_terms(
    objective: GRPO,
    logp_T: torch.Tensor,
    sampler_logp_T: torch.Tensor,
    ref_logp_T: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ℓ_i, κ_i) for one trajectory: its policy-gradient term (to be scaled by A_i) and its
    group-independent KL term, both before the batch denominator D."""
    pg = pg_term(objective, logp_T, sampler_logp_T)
    if objective.kl_coef == 0.0:
        return pg, None
    weight = token_weight(objective.loss_agg, logp_T.numel(), objective.max_tokens)
    if ref_logp_T is None:
        raise ValueError("GRPO kl_coef > 0 needs a reference model (Learner(reference=...))")
    kl = objective.kl_coef * weight * kl_penalty(logp_T, ref_logp_T, objective.kl_estimator)
    return pg, kl.sum()


def ppo_clip_loss(
    objective: GRPO,
    logp_T: torch.Tensor,
    old_logp_T: torch.Tensor,
    advantage: float,
    rho_T: torch.Tensor,
) -> torch.Tensor:
    """The textbook per-token PPO-clip surrogate −min(r A, clip(r, 1−ε_l, 1+ε_h) A)·ρ,
    summed with the trajectory's token weights (the batched sync path and async use it).
    At ratio 1 its gradient equals −A ρ ∇log π, the streaming form."""
    weight = token_weight(objective.loss_agg, logp_T.numel(), objective.max_tokens)
    ratio_T = torch.exp(logp_T - old_logp_T)
    clipped_T = ratio_T.clamp(1.0 - objective.clip_low, 1.0 + objective.clip_high)
    surrogate_T = torch.minimum(ratio_T * advantage, clipped_T * advantage)
    return -(weight * rho_T * surrogate_T).sum()


def clipped_tokens(objective: GRPO, ratio_T: torch.Tensor, advantage: float) -> torch.Tensor:
    """The tokens whose PPO-clip surrogate takes the clipped branch (and so has zero
    gradient): ratio above 1 + ε_high with A > 0, or below 1 − ε_low with A < 0."""
    if advantage > 0:
        return ratio_T.detach() > 1.0 + objective.clip_high
    if advantage < 0:
        return ratio_T.detach() < 1.0 - objective.clip_low
    return torch.zeros_like(ratio_T, dtype=torch.bool)


def opd_term(
    objective: OPD,
    logp_T: torch.Tensor,
    teacher_logp_T: torch.Tensor,
    sampler_logp_T: torch.Tensor,
    num_episode_tokens: int,
) -> torch.Tensor:
    """−Σ_t w_t Â_t log π_θ(a_t) for some action tokens of one episode (before 1/D)."""
    weight = token_weight(objective.loss_agg, num_episode_tokens, objective.max_tokens)
    advantage_T = (teacher_logp_T - sampler_logp_T).to(logp_T.dtype)
    return -(weight * advantage_T * logp_T).sum()


def clip_coefficient(grad_norm: float, max_norm: float | None) -> float:
    """torch.nn.utils.clip_grad_norm_'s scale: min(1, max_norm/(norm + 1e-6))."""
    if max_norm is None or not math.isfinite(grad_norm):
        return 1.0
    return min(1.0, max_norm / (grad_norm + 1e-6))
