"""``thundersync verify``: the equivalence certificate — streaming == sync on random batches.

For every objective variant and random batch (groups of 1–16, ties and all-equal groups,
1–8 turns, up to 300 tokens, random arrival order) it measures the relative error
‖g_a − g_b‖/‖g_b‖ of the step gradient of streaming vs sync, and of streaming vs a textbook
batch implementation written here from the equations (one backward of the whole loss), and
with ``--deterministic`` requires deterministic streaming and sync to be bitwise equal.

Bounds (DESIGN §3): 1e-12 when every op of the model runs in float64 (GPT-2 style); 1e-6 for
float32 and for models with float32 internals (Hugging Face Llama/Qwen run RMSNorm and rotary
embeddings in float32 even in a float64 model).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch

from thundersync import events as ev
from thundersync.learner import Learner
from thundersync.objectives import GRPO, OPD, Objective
from thundersync.rollouts import BatchShape, random_batch

FLOAT64_PURE_MODELS = ("gpt2",)
"""model_type values whose every op runs in the parameters' dtype."""


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    objective: Objective
    learner_kwargs: dict[str, Any] = field(default_factory=dict)
    needs_reference: bool = False


def variants(algo: str) -> list[Variant]:
    grpo = [
        Variant("grpo", GRPO()),
        Variant("grpo-token-mean", GRPO(loss_agg="token-mean")),
        Variant("dr-grpo", GRPO(loss_agg="seq-mean-token-sum-norm", scale_by_std=False)),
        Variant("grpo-kl-k1", GRPO(kl_coef=0.1, kl_estimator="k1"), needs_reference=True),
        Variant("grpo-kl-k3", GRPO(kl_coef=0.1, kl_estimator="k3"), needs_reference=True),
        Variant("grpo-tis", GRPO(tis_cap=2.0, clip_high=0.28)),
        Variant("grpo-dynamic", GRPO(dynamic_sampling=True, max_groups=2)),
        Variant("grpo-early-start", GRPO(), {"early_start": True}),
        Variant("grpo-budget", GRPO(kl_coef=0.05), {"early_start": True, "budget_buffers": 3},
                needs_reference=True),
    ]  # fmt: skip
    opd = [
        Variant("opd-turn", OPD(granularity="turn")),
        Variant("opd-episode", OPD(granularity="episode")),
        Variant("opd-seq-mean", OPD(loss_agg="seq-mean-token-mean")),
    ]
    return {"grpo": grpo, "opd": opd, "all": grpo + opd}[algo]


# --- the textbook reference -------------------------------------------------------------------


def _episodes(events: list[ev.Event]) -> dict[str, dict[str, Any]]:
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
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                      for g, p in zip(grads, params)])  # fmt: skip


def _flat(table: dict[int, Any], index: int | None) -> list[float]:
    return [x for k in sorted(table) for x in (table[k] if index is None else table[k][index])]


def _weight(objective: Objective, n: int) -> float:
    if objective.loss_agg == "seq-mean-token-mean":
        return 1.0 / n
    return 1.0 if objective.loss_agg == "token-mean" else 1.0 / objective.max_tokens


def _natural(text: str) -> tuple:
    import re

    return tuple(
        (0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text)
    ), text


# --- running the certificate ------------------------------------------------------------------


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖₂ / ‖b‖₂ (‖a‖₂ when b is zero: then a must be exactly zero too)."""
    scale = float(b.norm())
    diff = float((a - b).norm())
    return diff / scale if scale > 0 else diff


def bound_for(model: torch.nn.Module) -> tuple[float, str]:
    """The agreement bound that applies to ``model`` and why (DESIGN §3)."""
    dtype = next(model.parameters()).dtype
    model_type = getattr(model.config, "model_type", "?")
    if dtype == torch.float64 and model_type in FLOAT64_PURE_MODELS:
        return 1e-12, f"{model_type} in float64: every op in float64"
    if dtype == torch.float64:
        return 1e-6, f"{model_type} in float64 with float32 internals (norms, rotary)"
    return 1e-6, f"{model_type} in {str(dtype).removeprefix('torch.')}"


def learner_gradient(model, variant: Variant, events, *, streaming: bool, deterministic: bool,
                     reference=None) -> torch.Tensor:  # fmt: skip
    """The step gradient the Learner produces (SGD with lr 0 leaves the model unchanged)."""
    kwargs = dict(variant.learner_kwargs)
    buffers = kwargs.pop("budget_buffers", None)
    if buffers is not None:
        params = [p for p in model.parameters() if p.requires_grad]
        numel = sum(p.numel() for p in params)
        kwargs["buffer_budget_bytes"] = buffers * numel * params[0].element_size()
    learner = Learner(
        model, variant.objective, torch.optim.SGD(model.parameters(), lr=0.0),
        streaming=streaming, deterministic=deterministic, reference=reference,
        max_grad_norm=None, keep_last_gradient=True, **kwargs,
    )  # fmt: skip
    for event in events:
        learner.consume(event)
    learner.step()
    assert learner.last_gradient is not None
    return learner.last_gradient.clone()


def certify(model, variant: Variant, *, trials: int, seed: int, deterministic: bool,
            reference=None, shape: BatchShape | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``trials`` random batches of one variant; returns the errors and the verdict."""
    bound, why = bound_for(model)
    shape = shape or BatchShape()
    vocab = model.config.vocab_size
    worst_sync = worst_textbook = 0.0
    bitwise = True
    teacher = isinstance(variant.objective, OPD)
    for trial in range(trials):
        arrival = ("interleaved", "shuffled")[trial % 2]
        events = random_batch(seed * 1000 + trial, vocab, shape, teacher=teacher, arrival=arrival)
        sync = learner_gradient(model, variant, events, streaming=False, deterministic=False,
                                reference=reference)  # fmt: skip
        stream = learner_gradient(model, variant, events, streaming=True, deterministic=False,
                                  reference=reference)  # fmt: skip
        book = textbook_gradient(model, variant.objective, events, reference)
        worst_sync = max(worst_sync, relative_error(stream, sync))
        worst_textbook = max(worst_textbook, relative_error(stream, book))
        if deterministic:
            a = learner_gradient(model, variant, events, streaming=False, deterministic=True,
                                 reference=reference)  # fmt: skip
            b = learner_gradient(model, variant, events, streaming=True, deterministic=True,
                                 reference=reference)  # fmt: skip
            bitwise = bitwise and torch.equal(a, b)
            worst_textbook = max(worst_textbook, relative_error(b, book))
    ok = worst_sync <= bound and worst_textbook <= bound and (bitwise or not deterministic)
    ok = ok and math.isfinite(worst_sync) and math.isfinite(worst_textbook)
    return {
        "variant": variant.name,
        "objective": repr(variant.objective),
        "trials": trials,
        "max_rel_err_stream_vs_sync": worst_sync,
        "max_rel_err_stream_vs_textbook": worst_textbook,
        "bitwise_equal_deterministic": bitwise if deterministic else None,
        "bound": bound,
        "bound_reason": why,
        "ok": ok,
    }


def _models(args: argparse.Namespace) -> list[tuple[str, torch.nn.Module, torch.nn.Module]]:
    """(label, model, reference) for ``--model`` or for the two tiny models, built in a
    temporary folder that is gone once they are loaded."""
    if args.model:
        return [_load_pair(args.model, args.model, args)]
    from thundersync.models import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="thundersync-verify-") as tmp:
        return [
            _load_pair(f"tiny-{arch}", str(build_tiny_model(f"{tmp}/{arch}", arch)), args)
            for arch in ("gpt2", "qwen3")
        ]


def _load_pair(label: str, path: str, args: argparse.Namespace) -> tuple:
    from thundersync.models import load_model

    dtype = getattr(torch, args.dtype)
    model = load_model(path, dtype=dtype)
    reference = load_model(path, dtype=dtype)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        for p in reference.parameters():
            p.add_(torch.randn_like(p), alpha=0.02)
    return label, model, reference


def run_verify_command(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    torch.manual_seed(args.seed)
    models = _models(args)
    todo = [(label, m, r, v) for label, m, r in models for v in variants(args.algo)]
    results = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task("certifying", total=len(todo))
        for label, model, reference, variant in todo:
            result = certify(model, variant, trials=args.trials, seed=args.seed,
                             deterministic=args.deterministic, reference=reference)  # fmt: skip
            results.append({"model": label, **result})
            progress.advance(bar)
    ok = all(r["ok"] for r in results)
    if args.json:
        print(json.dumps({"ok": ok, "results": results}, indent=2))
    else:
        table = Table(title="streaming == sync certificate")
        for column in ("model", "variant", "stream vs sync", "stream vs textbook", "bitwise",
                       "bound", "ok"):  # fmt: skip
            table.add_column(column, no_wrap=True)
        for r in results:
            bit = r["bitwise_equal_deterministic"]
            table.add_row(r["model"], r["variant"], f"{r['max_rel_err_stream_vs_sync']:.1e}",
                          f"{r['max_rel_err_stream_vs_textbook']:.1e}",
                          "-" if bit is None else str(bit), f"{r['bound']:.0e}",
                          "[green]yes" if r["ok"] else "[red]NO")  # fmt: skip
        Console().print(table)
        for label, model, _ in models:
            print(f"{label}: bound {bound_for(model)[0]:.0e} ({bound_for(model)[1]})")
    if not ok:
        print("verify: VIOLATION: some variant exceeded its bound", file=sys.stderr)
    return 0 if ok else 1
