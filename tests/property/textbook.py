"""An independent textbook implementation of the batch losses, written for the tests.

It shares no code with the learner: its own assembly of events, its own log-prob gather, its
own advantages, one backward pass over the whole batch loss.
"""

from __future__ import annotations

import statistics

import torch

from thundersync import events as ev


def _natural(s: str) -> list:
    out, num = [], ""
    for ch in s + "\0":
        if ch.isdigit():
            num += ch
            continue
        if num:
            out.append((0, int(num)))
            num = ""
        if ch != "\0":
            out.append((1, ch))
    return out


class Episode:
    def __init__(self) -> None:
        self.prompt: list[int] = []
        self.group = ""
        self.actions: dict[int, tuple] = {}
        self.obs: dict[int, tuple] = {}
        self.teacher: dict[int, tuple] = {}
        self.sampler: dict[int, tuple] = {}
        self.reward = 0.0
        self.infra = False

    def sequence(self) -> tuple[list[int], list[int]]:
        """Token ids and the indices (into ids) of the action tokens."""
        ids = list(self.prompt)
        where = []
        turns = sorted(self.actions)
        for k in turns:
            where += range(len(ids), len(ids) + len(self.actions[k]))
            ids += self.actions[k]
            if k != turns[-1]:
                ids += self.obs[k]
        return ids, where


def collect(events: list[ev.Event]) -> dict[str, Episode]:
    eps: dict[str, Episode] = {}
    for e in events:
        ep = eps.setdefault(e.episode_id, Episode())
        if isinstance(e, ev.EpisodeStarted):
            ep.prompt, ep.group = list(e.prompt_ids), e.group_id
        elif isinstance(e, ev.TurnCompleted):
            ep.actions[e.turn] = e.action_ids
            ep.sampler[e.turn] = e.action_logprobs
        elif isinstance(e, ev.ToolFinished):
            ep.obs[e.turn] = e.observation_ids
        elif isinstance(e, ev.TeacherScored):
            ep.teacher[e.turn] = e.teacher_logprobs
        elif isinstance(e, ev.RewardReady):
            ep.reward, ep.infra = e.reward, e.infra_failure
    return eps


def sampler_logprobs(ep: Episode) -> list[float]:
    return [x for k in sorted(ep.actions) for x in ep.sampler[k]]


def teacher_logprobs(ep: Episode) -> list[float]:
    return [x for k in sorted(ep.actions) for x in ep.teacher[k]]


def action_logprobs(model, ep: Episode) -> torch.Tensor:
    ids, where = ep.sequence()
    logits = model(input_ids=torch.tensor([ids])).logits[0]
    rows = torch.tensor(where) - 1
    targets = torch.tensor(ids)[rows + 1]
    return torch.log_softmax(logits[rows], dim=-1)[torch.arange(len(where)), targets]


def action_entropies(model, ep: Episode) -> torch.Tensor:
    """The exact entropy −Σ_v p log p of the model's next-token distribution at each action
    token's position, from probabilities (softmax), not from the learner's log-softmax."""
    ids, where = ep.sequence()
    logits = model(input_ids=torch.tensor([ids])).logits[0]
    p = torch.softmax(logits[torch.tensor(where) - 1].to(torch.float64), dim=-1)
    return -(p * torch.log(p)).sum(-1)


def advantages(rewards: list[float], scale: bool, eps: float) -> list[float]:
    if len(rewards) < 2 or len(set(rewards)) == 1:
        return [0.0] * len(rewards)
    mu = statistics.fmean(rewards)
    sd = statistics.stdev(rewards) if scale else None
    return [(r - mu) / (sd + eps) if scale else r - mu for r in rewards]


def weight(loss_agg: str, n: int, max_tokens: int) -> float:
    return {"seq-mean-token-mean": 1.0 / n, "token-mean": 1.0}.get(loss_agg, 1.0 / max_tokens)


def gradient(model, objective, events, reference=None) -> torch.Tensor:
    """The batch-loss gradient of GRPO or OPD, as a flat vector."""
    loss = batch_loss(model, objective, events, reference)
    params = [p for p in model.parameters() if p.requires_grad]
    if loss is None:
        return torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat(
        [(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(grads, params)]
    )


def batch_loss(model, objective, events, reference=None) -> torch.Tensor | None:
    """The batch loss of GRPO or OPD (on-policy: ratio 1) whose gradient the step takes;
    None when no episode is trained."""
    eps = collect(events)
    order = sorted(eps, key=_natural)
    loss_terms, sizes = [], []
    if type(objective).__name__ == "OPD":
        chosen = [(eid, None) for eid in order]
    else:
        groups: dict[str, list[str]] = {}
        for eid in order:
            if not eps[eid].infra:
                groups.setdefault(eps[eid].group, []).append(eid)
        chosen, n_groups = [], 0
        for gid in sorted(groups, key=_natural):
            rewards = [eps[e].reward for e in groups[gid]]
            if objective.dynamic_sampling and (len(rewards) < 2 or len(set(rewards)) == 1):
                continue
            if objective.max_groups is not None and n_groups >= objective.max_groups:
                continue
            n_groups += 1
            adv = advantages(rewards, objective.scale_by_std, objective.eps)
            chosen += list(zip(groups[gid], adv))
    for eid, adv in chosen:
        ep = eps[eid]
        lp = action_logprobs(model, ep)
        w = weight(objective.loss_agg, lp.numel(), objective.max_tokens)
        sampler = torch.tensor(sampler_logprobs(ep), dtype=lp.dtype)
        if adv is None:
            a_hat = torch.tensor(teacher_logprobs(ep), dtype=lp.dtype) - sampler
            loss_terms.append(-(w * a_hat * lp).sum())
        else:
            rho = torch.ones_like(lp)
            if objective.tis_cap is not None:
                cap = torch.tensor(objective.tis_cap, dtype=lp.dtype)
                rho = torch.minimum(torch.exp(lp.detach() - sampler), cap)
            term = -(adv * w * rho * lp).sum()
            if objective.kl_coef:
                with torch.no_grad():
                    ref = action_logprobs(reference, ep)
                d = lp - ref
                kl = d if objective.kl_estimator == "k1" else torch.exp(-d) + d - 1
                term = term + objective.kl_coef * w * kl.sum()
            loss_terms.append(term)
        sizes.append(lp.numel())
    if not loss_terms:
        return None
    denom = sum(sizes) if objective.loss_agg == "token-mean" else len(sizes)
    return sum(loss_terms) / denom
