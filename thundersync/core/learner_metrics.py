"""Step metrics beside the gradient: staleness of the trained tokens, PPO clipping, and the
engine-vs-learner log-prob mismatch (docs/design.md §5), from forward passes the learner runs
anyway.

The mismatch is not exactness: exactness compares two computations of the same gradient
(streaming vs sync), the mismatch compares the sampler's log-probs with the learner's on the
same tokens. Engines differ from the learner by kernels, precision and batching, so it is
never zero in practice; it is what ``GRPO.tis_cap`` corrects for.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import torch

from thundersync.protocol.episode import EpisodeRecord


class TokenStats:
    """Per piece of gradient work, the learner's log-probs compared with the sampler's (and
    the reference's, when the objective has a KL term), and the piece's loss terms.

    A piece is keyed ``(episode_id, turn)`` (turn None for the whole episode), so a piece
    computed twice counts once, and ``summary`` keeps only the trained episodes (streaming
    may compute a trajectory whose group dynamic sampling then drops). Everything here is
    read off tensors the gradient computes anyway, detached: the update does not change.
    """

    def __init__(self) -> None:
        self._rows: dict[tuple[str, int | None], torch.Tensor] = {}

    def record(
        self,
        key: tuple[str, int | None],
        logp_T: torch.Tensor,
        sampler_T: torch.Tensor,
        clipped_T: torch.Tensor | None = None,
        *,
        ref_T: torch.Tensor | None = None,
        loss: torch.Tensor | None = None,
        pg: torch.Tensor | None = None,
        kl: torch.Tensor | None = None,
        entropy_T: torch.Tensor | None = None,
    ) -> None:
        """Note one piece: Σ|d|, max|d|, Σ k3(d), token count, clipped-token count with
        d = log π_learner − log π_sampler; Σ −log π_learner; Σ k3 KL(π_learner ‖ π_ref) and
        its token count (``ref_T``: the reference's log-probs); its loss terms before
        1/D — ``loss`` when the piece's loss is known whole (advantage applied), else ``pg``
        (GRPO's ℓ_i, to be scaled by A_i in ``summary``); ``kl``: its KL term κ_i; and
        Σ of the policy's exact entropy at its tokens (``entropy_T``, from
        ``Policy.action_logprobs``). Kept on the device until the step."""
        with torch.no_grad():
            logp_T = logp_T.detach().to(torch.float64)
            d_T = logp_T - sampler_T.to(torch.float64)
            zero = d_T.new_zeros(())
            clipped = clipped_T.sum() if clipped_T is not None else zero
            ref_kl, ref_count = zero, zero
            if ref_T is not None:
                r_T = ref_T.detach().to(torch.float64) - logp_T
                ref_kl = (torch.exp(r_T) - r_T - 1.0).sum()
                ref_count = d_T.new_tensor(float(r_T.numel()))
            known = loss is not None
            self._rows[key] = torch.stack(
                [
                    d_T.abs().sum(),
                    d_T.abs().max(),
                    (torch.exp(d_T) - d_T - 1.0).sum(),
                    d_T.new_tensor(float(d_T.numel())),
                    clipped.to(torch.float64),
                    -logp_T.sum(),
                    ref_kl,
                    ref_count,
                    _value(loss if known else pg, zero),
                    _value(kl, zero),
                    d_T.new_tensor(float(known)),
                    entropy_T.detach().to(torch.float64).sum() if entropy_T is not None else zero,
                    d_T.new_tensor(float(entropy_T.numel()) if entropy_T is not None else 0.0),
                ]
            )

    def summary(
        self,
        episode_ids: Collection[str],
        num_trained_tokens: int,
        *,
        advantages: Mapping[str, float] | None = None,
        denominator: float = 1.0,
    ) -> dict[str, Any]:
        """The step's metrics over the pieces of ``episode_ids``; ``loss`` needs each GRPO
        episode's advantage (``advantages``) and the batch denominator D."""
        keys = [key for key in self._rows if key[0] in episode_ids]
        if not keys:
            return {
                "logprob_mismatch_mean": None,
                "logprob_mismatch_max": None,
                "kl_sampler_learner": None,
                "num_compared_tokens": 0,
                "clip_fraction": 0.0,
                "neg_logprob_mean": None,
                "entropy_mean": None,
                "kl_reference": None,
                "loss": 0.0,
            }
        table = torch.stack([self._rows[key] for key in keys])
        total_abs, total_k3, count, clipped, neg_logp, ref_kl, ref_count, entropy, entropy_count = (
            table[:, [0, 2, 3, 4, 5, 6, 7, 11, 12]].sum(0).tolist()
        )
        scale_K = table.new_tensor([(advantages or {}).get(key[0], 0.0) for key in keys])
        scale_K = torch.where(table[:, 10] > 0, torch.ones_like(scale_K), scale_K)
        loss = float((scale_K * table[:, 8] + table[:, 9]).sum()) / denominator
        return {
            "logprob_mismatch_mean": _finite_or_none(total_abs / count),
            "logprob_mismatch_max": _finite_or_none(float(table[:, 1].max())),
            "kl_sampler_learner": _finite_or_none(total_k3 / count),
            "num_compared_tokens": int(count),
            "clip_fraction": clipped / num_trained_tokens if num_trained_tokens else 0.0,
            "neg_logprob_mean": _finite_or_none(neg_logp / count),
            "entropy_mean": _finite_or_none(entropy / entropy_count) if entropy_count else None,
            "kl_reference": _finite_or_none(ref_kl / ref_count) if ref_count else None,
            "loss": _finite_or_none(loss),
        }


def _value(tensor: torch.Tensor | None, zero: torch.Tensor) -> torch.Tensor:
    return zero if tensor is None else tensor.detach().to(torch.float64).reshape(())


def _finite_or_none(value: float) -> float | None:
    """None for a sum that overflowed: a sampler log-prob near ``MIN_LOGPROB`` where the learner
    gives ~0 makes k3 = exp(d) − d − 1 exceed the largest double (d > 709.78); a metric
    that is not a number is reported as None, never as inf or NaN."""
    return value if math.isfinite(value) else None


def staleness_metrics(episodes: Iterable[EpisodeRecord], policy_version: int) -> dict[str, Any]:
    """``staleness_histogram`` ({versions behind: action tokens}, keys as strings for JSON)
    over every action token of ``episodes``, and ``max_staleness_seen`` (None without any)."""
    histogram: dict[int, int] = {}
    for rec in episodes:
        last = rec.num_turns if rec.num_turns is not None else len(rec.actions)
        for k, action in rec.actions.items():
            if k < last:
                behind = policy_version - action.policy_version
                histogram[behind] = histogram.get(behind, 0) + len(action.action_ids)
    return {
        "staleness_histogram": {str(k): histogram[k] for k in sorted(histogram)},
        "max_staleness_seen": max(histogram) if histogram else None,
    }
