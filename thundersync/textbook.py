"""The textbook reference for ``thundersync verify``: one backward of the whole batch loss.

Written from the equations of docs/design.md §3 with no learner code (no accumulators, no
streaming, no canonical order), so that a bug shared by the learner's sync and streaming
paths still shows up as a disagreement with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from thundersync.core.objectives import OPD, Objective
from thundersync.protocol import events as ev


def _episodes(events: Sequence[ev.EpisodeEvent]) -> dict[str, dict[str, Any]]:
    eps: dict[str, dict[str, Any]] = {}
    for e in events:
        d = eps.setdefault(e.episode_id, {"actions": {}, "obs": {}, "teacher": {}})
        if isinstance(e, ev.EpisodeStarted):
            d.update(group=e.group_id, prompt=list(e.prompt_ids))
        elif isinstance(e, ev.TurnCompleted):
            d["actions"][e.turn] = (list(e.action_ids), list(e.action_logprobs))
        elif isinstance(e, ev.ToolFinished):
            d["obs"][e.turn] = list(e.observation_ids)
        elif isinstance(e, ev.TeacherScored):
            d["teacher"][e.turn] = list(e.teacher_logprobs)
        elif isinstance(e, ev.RewardReady):
            d.update(reward=e.reward, infra=e.infra_failure)
    return eps


def _logprobs(model: torch.nn.Module, ep: dict[str, Any]) -> torch.Tensor:
    ids, is_action = list(ep["prompt"]), [False] * len(ep["prompt"])
    num_turns = len(ep["actions"])
    for k in range(num_turns):
        ids += ep["actions"][k][0]
        is_action += [True] * len(ep["actions"][k][0])
        if k < num_turns - 1:
            ids += ep["obs"][k]
            is_action += [False] * len(ep["obs"][k])
    x = torch.tensor([ids])
    logp = torch.log_softmax(model(input_ids=x).logits[0, :-1], dim=-1)
    token_logp = logp.gather(-1, x[0, 1:, None])[:, 0]
    return token_logp[torch.tensor(is_action[1:])]


def textbook_gradient(model, objective, events, reference=None) -> torch.Tensor:
    """One backward of the whole batch loss, computed from the equations (no learner code)."""
    eps, key = _episodes(events), _natural
    params = [p for p in model.parameters() if p.requires_grad]
    terms, counts = [], []
    if isinstance(objective, OPD):
        for eid in sorted(eps, key=key):
            ep = eps[eid]
            lp = _logprobs(model, ep)
            teacher = torch.tensor(_flat(ep["teacher"], None), dtype=lp.dtype)
            sampler = torch.tensor(_flat(ep["actions"], 1), dtype=lp.dtype)
            w = _weight(objective, lp.numel())
            terms.append(-(w * (teacher - sampler).to(lp.dtype) * lp).sum())
            counts.append(lp.numel())
    else:
        groups: dict[str, list[str]] = {}
        for eid in sorted(eps, key=key):
            if not eps[eid]["infra"]:
                groups.setdefault(eps[eid]["group"], []).append(eid)
        kept_groups = 0
        for gid in sorted(groups, key=key):
            r = torch.tensor([eps[e]["reward"] for e in groups[gid]], dtype=torch.float64)
            flat = len(r) < 2 or bool((r == r[0]).all())
            if objective.dynamic_sampling and flat:
                continue
            if objective.max_groups is not None and kept_groups == objective.max_groups:
                break
            kept_groups += 1
            if flat:
                adv = torch.zeros_like(r)
            elif objective.scale_by_std:
                adv = (r - r.mean()) / (r.std() + objective.eps)
            else:
                adv = r - r.mean()
            for eid, a in zip(groups[gid], adv.tolist()):
                ep = eps[eid]
                lp = _logprobs(model, ep)
                sampler = torch.tensor(_flat(ep["actions"], 1), dtype=lp.dtype)
                rho = torch.ones_like(lp)
                if objective.tis_cap is not None:
                    rho = torch.exp(lp.detach() - sampler).clamp(max=objective.tis_cap)
                w = _weight(objective, lp.numel())
                term = -(w * rho * a * lp).sum()
                if objective.kl_coef:
                    with torch.no_grad():
                        ref = _logprobs(reference, ep)
                    if objective.kl_estimator == "k1":
                        kl = lp - ref
                    else:
                        kl = torch.exp(ref - lp) - (ref - lp) - 1
                    term = term + (objective.kl_coef * w * kl).sum()
                terms.append(term)
                counts.append(lp.numel())
    if not terms:
        return torch.cat([torch.zeros_like(p).reshape(-1) for p in params])
    denom = sum(counts) if objective.loss_agg == "token-mean" else len(counts)
    loss = torch.stack(terms).sum() / denom
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat(
        [(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)]
    )


def _flat(table: dict[int, Any], index: int | None) -> list[float]:
    return [x for k in sorted(table) for x in (table[k] if index is None else table[k][index])]


def _weight(objective: Objective, n: int) -> float:
    if objective.loss_agg == "seq-mean-token-mean":
        return 1.0 / n
    return 1.0 if objective.loss_agg == "token-mean" else 1.0 / objective.max_tokens


def _natural(text: str) -> tuple:
    return tuple(
        (0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text)
    ), text
