"""``gpu_check.py``'s engine items (``engine-hf``, ``engine-vllm``): the rollout engine on the GPU
takes new weights in place and samples as a fresh engine and the learner say it should."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_context import Check, ItemFailed, ItemSkipped
from gpu_items import module_version, noisy_copy, warm_model


def engine_item(kind: str) -> Callable[[Check], dict[str, Any]]:
    def run(check: Check) -> dict[str, Any]:
        return engine_check(check, kind)

    run.__name__ = f"engine_{kind}"
    return run


def engine_check(check: Check, kind: str) -> dict[str, Any]:
    """The engine takes new weights in place (the learner's flat vector, policy version 1):
    its samples then equal a fresh engine's built from those weights' checkpoint, and the
    log-probs it reports match the learner's forward pass of the same tokens."""
    import torch

    from thundersync.models import load_model
    from thundersync.training.engines.engine import GenerationRequest, SamplingParams

    if kind == "vllm" and module_version("vllm") is None:
        raise ItemSkipped(
            "vLLM is not installed here (`--install` or `pip install vllm` on a machine that "
            "reaches a package registry)"
        )
    model_dir = warm_model(check)
    updated = check.work / f"updated-{kind}"
    if not updated.is_dir():
        noisy_copy(model_dir, updated)
    flat = torch.nn.utils.parameters_to_vector(load_model(updated).parameters()).detach()
    build = _engine_factory(check, kind)
    prompt = [list(range(5, 12)), list(range(20, 31)), list(range(7, 10))]
    greedy = [
        GenerationRequest(tuple(p), SamplingParams(16, temperature=0.0), i)
        for i, p in enumerate(prompt)
    ]
    sampled = [
        GenerationRequest(tuple(p), SamplingParams(16), 100 + i) for i, p in enumerate(prompt)
    ]
    started = time.monotonic()
    engine = build(model_dir)
    built_s = time.monotonic() - started
    try:
        before = engine.generate(sampled)
        started = time.monotonic()
        engine.load_weights(flat.to(check.device), policy_version=1)
        load_s = time.monotonic() - started
        after_greedy, after = engine.generate(greedy), engine.generate(sampled)
    finally:
        engine.close()
    fresh = build(updated)
    try:
        fresh_greedy, fresh_sampled = fresh.generate(greedy), fresh.generate(sampled)
    finally:
        fresh.close()
    learner = load_model(updated).to(check.device)
    mismatch = [
        abs(a - b)
        for request, completion in zip(sampled, after)
        for a, b in zip(completion.logprobs, _learner_logprobs(learner, request, completion))
    ]
    details = {
        "engine_start_s": round(built_s, 2),
        "load_weights_s": round(load_s, 4),
        "policy_versions": sorted({c.policy_version for c in after + after_greedy}),
        "greedy_equal_fresh": [c.token_ids for c in after_greedy]
        == [c.token_ids for c in fresh_greedy],
        "sampled_equal_fresh": [c.token_ids for c in after] == [c.token_ids for c in fresh_sampled],
        "changed_by_update": [c.logprobs for c in before] != [c.logprobs for c in after],
        "logprob_mismatch_max": max(mismatch),
        "logprob_mismatch_mean": sum(mismatch) / len(mismatch),
        "tokens_compared": len(mismatch),
    }
    if details["policy_versions"] != [1]:
        raise ItemFailed(f"policy versions after the load: {details['policy_versions']}", details)
    if not details["greedy_equal_fresh"]:
        raise ItemFailed(
            "greedy tokens after the in-place load differ from a fresh engine's", details
        )
    if not details["changed_by_update"]:
        raise ItemFailed("the in-place load changed nothing the engine reports", details)
    limit = 1e-3 if kind == "hf" else 1e-2
    if details["logprob_mismatch_max"] > limit:
        raise ItemFailed(f"log-prob mismatch against the learner above {limit}", details)
    return details


def _engine_factory(check: Check, kind: str) -> Callable[[Path], Any]:
    if kind == "hf":
        from thundersync.training.engines.hf import HFEngine

        return lambda folder: HFEngine(folder, device=check.device, batch_invariant=True)
    from thundersync.training.engines.vllm import VLLMEngine

    return lambda folder: VLLMEngine(folder, batch_invariant=True, max_num_seqs=8)


def _learner_logprobs(model: Any, request: Any, completion: Any) -> list[float]:
    """log π(token | context) of each sampled token by a plain forward pass (the learner's
    float32 model; temperature 1)."""
    import torch

    ids = list(request.prompt_ids) + list(completion.token_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    start = len(request.prompt_ids)
    return [float(logp[start + i - 1, t]) for i, t in enumerate(completion.token_ids)]
