"""Async (``max_staleness > 0``): the learner's step equals a textbook PPO-clip update taken
against the sampler's log-probs, written here from the equations (no learner code)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.property import textbook
from thundersync import GRPO, Learner
from thundersync import events as ev
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.models import load_model

SHAPE = BatchShape(max_groups=3, max_group_size=4, max_turns=3, max_tokens=48)
VARIANTS = {
    "grpo": GRPO(),
    "dapo": GRPO(loss_agg="token-mean", clip_high=0.28),
    "dr-grpo": GRPO(loss_agg="seq-mean-token-sum-norm", scale_by_std=False, clip_low=0.1),
    "kl-k3": GRPO(kl_coef=0.1),
    "dynamic": GRPO(dynamic_sampling=True, max_groups=2),
}


@pytest.fixture(scope="module")
def models(tiny_model_dirs):
    model = load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)
    reference = load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        for p in reference.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.02)
    return model, reference


def behaviour_batch(model, seed: int, version: int) -> list[ev.Event]:
    """A batch sampled by versions ``version − 1`` and ``version``, whose sampler log-probs
    sit near the learner's (ratio ≈ 1), far below (ratio ≫ 1) or far above (ratio ≪ 1)."""
    rng = random.Random(seed)
    events = random_batch(seed, model.config.vocab_size, SHAPE, policy_version=version - 1)
    episodes = textbook.collect(events)
    out = []
    for e in events:
        if isinstance(e, ev.TurnCompleted):
            ep = episodes[e.episode_id]
            with torch.no_grad():
                learner_lp = textbook.action_logprobs(model, ep).tolist()
            offset = sum(len(ep.actions[k]) for k in sorted(ep.actions) if k < e.turn)
            shift = rng.choice([0.0, 3.0, -3.0])
            logprobs = tuple(
                min(learner_lp[offset + j] + shift + rng.gauss(0.0, 0.05), 0.0)
                for j in range(len(e.action_ids))
            )
            e = dataclasses.replace(
                e, action_logprobs=logprobs, policy_version=version - rng.randint(0, 1)
            )
        out.append(e)
    return out


def ppo_clip_gradient(model, objective, events, reference=None) -> tuple[torch.Tensor, int]:
    """∇ of −(1/D) Σ_i Σ_t w_i min(r_t A_i, clip(r_t, 1 − ε_l, 1 + ε_h) A_i) (+ KL), with
    r_t = π_θ(a_t)/π_sampler(a_t): per token, r_t A_i ∇log π where the unclipped branch is
    the minimum and 0 where the clipped one is. Also returns how many tokens were clipped."""
    eps = textbook.collect(events)
    groups: dict[str, list[str]] = {}
    for eid in sorted(eps, key=textbook._natural):
        if not eps[eid].infra:
            groups.setdefault(eps[eid].group, []).append(eid)
    chosen, num_groups = [], 0
    for gid in sorted(groups, key=textbook._natural):
        rewards = [eps[e].reward for e in groups[gid]]
        if objective.dynamic_sampling and (len(rewards) < 2 or len(set(rewards)) == 1):
            continue
        if objective.max_groups is not None and num_groups >= objective.max_groups:
            continue
        num_groups += 1
        chosen += list(
            zip(groups[gid], textbook.advantages(rewards, objective.scale_by_std, objective.eps))
        )
    terms, sizes, clipped = [], [], 0
    for eid, adv in chosen:
        lp = textbook.action_logprobs(model, eps[eid])
        behaviour = torch.tensor(textbook.sampler_logprobs(eps[eid]), dtype=lp.dtype)
        ratio = torch.exp(lp.detach() - behaviour)
        if adv > 0:
            live = ratio <= 1 + objective.clip_high
        elif adv < 0:
            live = ratio >= 1 - objective.clip_low
        else:
            live = torch.ones_like(ratio, dtype=torch.bool)
        clipped += int((~live).sum())
        w = textbook.weight(objective.loss_agg, lp.numel(), objective.max_tokens)
        term = -(w * adv * torch.where(live, ratio, 0.0) * lp).sum()
        if objective.kl_coef:
            with torch.no_grad():
                ref = textbook.action_logprobs(reference, eps[eid])
            d = lp - ref
            term = term + objective.kl_coef * w * (torch.exp(-d) + d - 1).sum()
        terms.append(term)
        sizes.append(lp.numel())
    params = [p for p in model.parameters() if p.requires_grad]
    if not terms:
        return torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype), 0
    denom = sum(sizes) if objective.loss_agg == "token-mean" else len(sizes)
    grads = torch.autograd.grad(sum(terms) / denom, params, allow_unused=True)
    flat = torch.cat(
        [(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(grads, params)]
    )
    return flat, clipped


@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(VARIANTS)))
def test_off_policy_step_is_the_textbook_ppo_clip_step(models, seed, name):
    model, reference = models
    objective = VARIANTS[name]
    events = behaviour_batch(model, seed, version=5)
    learner = Learner(
        model,
        objective,
        torch.optim.SGD(model.parameters(), lr=0.0),
        max_staleness=1,
        policy_version=5,
        max_grad_norm=None,
        reference=reference,
    )
    for event in events:
        learner.consume(event)
    metrics = learner.step()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    book, clipped = ppo_clip_gradient(model, objective, events, reference)
    assert float((got - book).norm()) <= 1e-12 * max(float(book.norm()), 1e-300)
    assert metrics["clip_fraction"] == pytest.approx(clipped / max(metrics["num_tokens"], 1))
    assert set(metrics["staleness_histogram"]) <= {"0", "1"}
