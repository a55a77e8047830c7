"""``thundersync verify``: the equivalence certificate — streaming == sync on random batches.

For every objective variant and random batch (groups of 1–16, ties and all-equal groups,
1–8 turns, up to 300 tokens, random arrival order) it measures the relative error
‖g_a − g_b‖/‖g_b‖ of the step gradient of streaming vs sync, and of streaming vs a textbook
batch implementation written from the equations (``thundersync.textbook``: one backward of
the whole loss), and with ``--deterministic`` requires deterministic streaming and sync to be
bitwise equal.

Bounds (docs/design.md §3): 1e-12 when every op of the model runs in float64 (GPT-2 style);
1e-6 for float32 and for models with float32 internals (Hugging Face Llama/Qwen run RMSNorm
and rotary embeddings in float32 even in a float64 model).

Nothing passes vacuously: fewer than one trial is refused, and a run with no checks is not OK.
Exit codes: 0 every check holds, 1 a violation, 2 bad input (``--trials``, ``--model``).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from thundersync.cli_output import WIDTH, Progress, fit, plain_table, print_verdict, strict_json
from thundersync.core.learner import Learner
from thundersync.core.objectives import GRPO, OPD, Objective
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.protocol.errors import ThunderSyncError
from thundersync.textbook import textbook_gradient

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
        Variant(
            "grpo-budget",
            GRPO(kl_coef=0.05),
            {"early_start": True, "budget_buffers": 3},
            needs_reference=True,
        ),
    ]
    opd = [
        Variant("opd-turn", OPD(granularity="turn")),
        Variant("opd-episode", OPD(granularity="episode")),
        Variant("opd-seq-mean", OPD(loss_agg="seq-mean-token-mean")),
    ]
    return {"grpo": grpo, "opd": opd, "all": grpo + opd}[algo]


# --- running the certificate ------------------------------------------------------------------


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖₂ / ‖b‖₂ (‖a‖₂ when b is zero: then a must be exactly zero too)."""
    scale = float(b.norm())
    diff = float((a - b).norm())
    return diff / scale if scale > 0 else diff


def bound_for(model: torch.nn.Module) -> tuple[float, str]:
    """The agreement bound that applies to ``model`` and why (docs/design.md §3)."""
    dtype = next(model.parameters()).dtype
    model_type = getattr(model.config, "model_type", "?")
    if dtype == torch.float64 and model_type in FLOAT64_PURE_MODELS:
        return 1e-12, f"{model_type} in float64, every op in float64"
    if dtype == torch.float64:
        return 1e-6, f"{model_type} in float64, float32 internals (norms, rotary)"
    return 1e-6, f"{model_type} in {str(dtype).removeprefix('torch.')}"


def learner_gradient(
    model, variant: Variant, events, *, streaming: bool, deterministic: bool, reference=None
) -> torch.Tensor:
    """The step gradient the Learner produces, read from the parameters' ``.grad`` after
    ``step()``: with SGD at lr 0 and no clipping that is the step gradient, and the model is
    left unchanged for the next run."""
    kwargs = dict(variant.learner_kwargs)
    buffers = kwargs.pop("budget_buffers", None)
    params = [p for p in model.parameters() if p.requires_grad]
    if buffers is not None:
        numel = sum(p.numel() for p in params)
        kwargs["buffer_budget_bytes"] = buffers * numel * params[0].element_size()
    for p in params:
        p.grad = None  # a previous run's gradient must not stand in for this one's
    learner = Learner(
        model,
        variant.objective,
        torch.optim.SGD(params, lr=0.0),
        streaming=streaming,
        deterministic=deterministic,
        reference=reference,
        max_grad_norm=None,
        **kwargs,
    )
    for event in events:
        learner.consume(event)
    learner.step()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if missing:
        raise RuntimeError(f"Learner.step() left no .grad on parameter(s) {missing[:3]}")
    return torch.cat([p.grad.reshape(-1) for p in params])


def certify(
    model,
    variant: Variant,
    *,
    trials: int,
    seed: int,
    deterministic: bool,
    reference=None,
    shape: BatchShape | None = None,
    batches: Sequence[Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """Run ``trials`` (>= 1) random batches of one variant, or the given ``batches`` of events
    (a user's trajectories; ``trials`` is then their number); returns the errors and the
    verdict."""
    if batches is not None:
        trials = len(batches)
    if trials < 1:
        raise ValueError(f"trials must be >= 1 (zero batches would certify nothing), got {trials}")
    bound, why = bound_for(model)
    shape = shape or BatchShape()
    vocab = model.config.vocab_size
    worst_sync = worst_textbook = 0.0
    bitwise = True
    zero = True  # every batch's step gradient exactly zero: the check compared nothing
    teacher = isinstance(variant.objective, OPD)
    for trial in range(trials):
        arrival = ("interleaved", "shuffled")[trial % 2]
        if batches is not None:
            events = list(batches[trial])
        else:
            events = random_batch(
                seed * 1000 + trial, vocab, shape, teacher=teacher, arrival=arrival
            )
        sync = learner_gradient(
            model, variant, events, streaming=False, deterministic=False, reference=reference
        )
        stream = learner_gradient(
            model, variant, events, streaming=True, deterministic=False, reference=reference
        )
        book = textbook_gradient(model, variant.objective, events, reference)
        worst_sync = max(worst_sync, relative_error(stream, sync))
        zero = zero and not bool(sync.any())
        worst_textbook = max(worst_textbook, relative_error(stream, book))
        if deterministic:
            a = learner_gradient(
                model, variant, events, streaming=False, deterministic=True, reference=reference
            )
            b = learner_gradient(
                model, variant, events, streaming=True, deterministic=True, reference=reference
            )
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
        "zero_gradient": zero,
    }


class ModelLoadError(ValueError):
    """``--model`` names no loadable checkpoint."""


def _models(args: argparse.Namespace) -> list[tuple[str, torch.nn.Module, torch.nn.Module]]:
    """(label, model, reference) for ``--model`` or for the two tiny models, built in a
    temporary folder that is gone once they are loaded."""
    if args.model:
        try:
            return [_load_pair(args.model, args.model, args)]
        except Exception as exc:  # any failure to load is a bad --model, reported in one line
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            reason = reason.removeprefix(f"{args.model}: ")
            message = f"--model {args.model}: cannot load a checkpoint: {reason}"
            raise ModelLoadError(message) from exc
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
    if getattr(args, "lora", False):
        return _adapted_pair(label, model, args.seed)
    reference = load_model(path, dtype=dtype)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        for p in reference.parameters():
            p.add_(torch.randn_like(p), alpha=0.02)
    return label, model, reference


def _adapted_pair(label: str, model: torch.nn.Module, seed: int) -> tuple:
    """``--lora``: the model with LoRA adapters on every linear layer, A and B both drawn at
    random (peft's default B = 0 would leave A without a gradient), trained alone; the
    reference is the base, adapters disabled (as ``train --lora`` uses it)."""
    from thundersync.lora import BaseOfAdapter, LoraSettings, add_adapters

    settings = LoraSettings(rank=4, target_modules=("all-linear",))
    adapted = add_adapters(model, settings, seed=seed, init=False)
    return f"{label}+lora", adapted, BaseOfAdapter(adapted)


def run_verify_command(args: argparse.Namespace) -> int:
    """Run the certificate: 0 when every check holds, 1 on a violation, 2 on bad input."""
    batches = None
    if getattr(args, "trajectories", None):
        from thundersync.interop.atif import AtifError

        try:
            batches, note = trajectory_batches(args.trajectories)
        except AtifError as exc:
            return _error(f"--trajectories {args.trajectories}: {exc}")
    elif args.trials < 1:
        return _error(f"--trials must be >= 1, got {args.trials}: zero batches certify nothing")
    torch.manual_seed(args.seed)
    try:
        models = _models(args)
    except ModelLoadError as exc:
        return _error(str(exc))
    chosen = variants(args.algo)
    if batches is not None:
        try:
            chosen = trajectory_variants(batches, chosen, args.algo, models)
        except ValueError as exc:
            return _error(f"--trajectories {args.trajectories}: {exc}")
    todo = [(label, m, r, v) for label, m, r in models for v in chosen]
    results = []
    with Progress("verify", len(todo), "checks") as progress:
        for label, model, reference, variant in todo:
            try:
                result = certify(
                    model,
                    variant,
                    trials=args.trials,
                    seed=args.seed,
                    deterministic=args.deterministic,
                    reference=reference,
                    batches=batches,
                )
                if batches is not None and result["zero_gradient"]:  # compared nothing
                    result["ok"] = False
            except ThunderSyncError as exc:  # only a user's batch can be refused
                first = (str(exc).splitlines() or [type(exc).__name__])[0]
                return _error(f"--trajectories {args.trajectories}: {variant.name}: {first}")
            results.append({"model": label, **result})
            progress.advance()
    ok, line = verdict(results, num_models=len(models), deterministic=args.deterministic)
    if args.json:
        report = {"ok": ok, "verdict": line, "results": results}
        if batches is not None:
            report["trajectories"] = note
        print(strict_json(report))
    else:
        print("\n".join(certificate_table(results, deterministic=args.deterministic)))
        for label, model, _ in models:
            bound, why = bound_for(model)
            print(fit(f"{_short(label)}: bound {bound:.0e} ({why})"))
        if batches is not None:
            print(fit(note))
    print_verdict(line, to_stderr=args.json)
    return 0 if ok else 1


def trajectory_batches(folder: str) -> tuple[list[list[Any]], str]:
    """A user's ATIF trajectories as certificate batches, and a line saying what they are.

    One batch per policy version that started episodes (a training step's batch); every
    token's version is relabelled to the fresh learner's 0, because the certificate compares
    two ways of computing one step on the same tokens and the version only gates staleness.
    """
    import dataclasses

    from thundersync.interop.atif import load_atif
    from thundersync.protocol.events import EpisodeStarted, RewardReady, TurnCompleted

    events = load_atif([folder])
    version_of: dict[str, int] = {}
    for e in events:
        if isinstance(e, EpisodeStarted):
            version_of[e.episode_id] = e.policy_version
    batches: dict[int, list[Any]] = {}
    for e in events:
        if isinstance(e, EpisodeStarted | TurnCompleted):
            e = dataclasses.replace(e, policy_version=0)
        batches.setdefault(version_of[e.episode_id], []).append(e)
    rewards: dict[str, set[float]] = {}
    group_of = {e.episode_id: e.group_id for e in events if isinstance(e, EpisodeStarted)}
    for e in events:
        if isinstance(e, RewardReady):
            rewards.setdefault(group_of[e.episode_id], set()).add(e.reward)
    unequal = sum(len(r) > 1 for r in rewards.values())
    note = (
        f"trajectories: {len(version_of)} episodes, {len(rewards)} groups ({unequal} with "
        f"unequal rewards), {len(batches)} batch{'es' * (len(batches) != 1)}"
    )
    return [batches[v] for v in sorted(batches)], note


def trajectory_variants(
    batches: list[list[Any]], chosen: list[Variant], algo: str, models: list[tuple]
) -> list[Variant]:
    """The variants that apply to a user's batches: OPD's only when every turn has teacher
    scores; ``ValueError`` when a token id lies outside a model's vocabulary."""
    from thundersync.protocol.events import (
        EpisodeStarted,
        TeacherScored,
        ToolFinished,
        TurnCompleted,
    )

    ids = [
        i
        for batch in batches
        for e in batch
        for f in ("prompt_ids", "action_ids", "observation_ids")
        if isinstance(e, EpisodeStarted | TurnCompleted | ToolFinished)
        for i in getattr(e, f, ())
    ]
    for label, model, _ in models:
        vocab = model.config.vocab_size
        if ids and max(ids) >= vocab:
            raise ValueError(
                f"token id {max(ids)} is outside {_short(label)}'s vocabulary of {vocab}: "
                "pass --model the checkpoint that sampled them"
            )
    turns = sum(isinstance(e, TurnCompleted) for b in batches for e in b)
    scored = sum(isinstance(e, TeacherScored) for b in batches for e in b)
    if scored == turns:
        return chosen
    if algo == "opd":
        raise ValueError(f"OPD needs teacher scores on every turn: {scored} of {turns} have them")
    return [v for v in chosen if not isinstance(v.objective, OPD)]


def _error(message: str) -> int:
    print(fit(f"verify: error: {message}", 10 * WIDTH), file=sys.stderr)
    return 2


def _short(label: str, width: int = 14) -> str:
    """A model label for a table cell: the folder's name, cut from the left if need be."""
    name = label.rstrip("/").rsplit("/", 1)[-1]
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def _worst(result: dict[str, Any]) -> float:
    """The larger error of a check as a multiple of its bound (inf when not a number)."""
    errs = (result["max_rel_err_stream_vs_sync"], result["max_rel_err_stream_vs_textbook"])
    if not all(math.isfinite(e) for e in errs):
        return math.inf
    return max(errs) / result["bound"]


def verdict(
    results: list[dict[str, Any]], *, num_models: int, deterministic: bool
) -> tuple[bool, str]:
    """(ok, the one-line verdict). No checks at all is not OK: nothing was certified."""
    if not results:
        return False, "verify: VIOLATION: no checks ran, nothing is certified"
    n = len(results)
    num_variants = len({r["variant"] for r in results})
    worst = max(results, key=_worst)
    err = max(worst["max_rel_err_stream_vs_sync"], worst["max_rel_err_stream_vs_textbook"])
    failed = [r for r in results if not r["ok"]]
    if not failed:
        models = f"{num_models} model{'s' * (num_models != 1)}"
        return True, (
            f"verify: OK: {n} checks ({models} x {num_variants} variants), "
            f"worst {err:.1e} <= {worst['bound']:.0e}" + (", bitwise" if deterministic else "")
        )
    worst = max(failed, key=_worst)
    err = max(worst["max_rel_err_stream_vs_sync"], worst["max_rel_err_stream_vs_textbook"])
    where = f"{worst['variant']} on {_short(worst['model'])}"
    if err <= worst["bound"] and worst.get("zero_gradient"):  # a user's batch of tied rewards
        return False, f"verify: VIOLATION: {len(failed)} of {n} checks, {where}: zero gradient"
    if err <= worst["bound"]:  # within the bound, so the deterministic runs differed
        return False, f"verify: VIOLATION: {len(failed)} of {n} checks, {where}: not bitwise equal"
    return False, (
        f"verify: VIOLATION: {len(failed)} of {n} checks, {where}: {err:.1e} > {worst['bound']:.0e}"
    )


def certificate_table(results: list[dict[str, Any]], *, deterministic: bool) -> list[str]:
    """The per-check table as plain lines of at most 80 columns (details are in ``--json``)."""
    header = ["model", "variant", "vs sync", "vs textbook", "bound", "ok"]
    widths = [14, 16, 7, 11, 5, 3]
    if deterministic:
        header.insert(5, "bitwise")
        widths.insert(5, 7)
    rows = []
    for r in results:
        row = [
            _short(r["model"]),
            r["variant"],
            f"{r['max_rel_err_stream_vs_sync']:.1e}",
            f"{r['max_rel_err_stream_vs_textbook']:.1e}",
            f"{r['bound']:.0e}",
            "yes" if r["ok"] else "NO",
        ]
        if deterministic:
            row.insert(5, "yes" if r["bitwise_equal_deterministic"] else "NO")
        rows.append(row)
    return plain_table(header, rows, widths)
