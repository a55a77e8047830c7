"""The rollout-engine protocol: token ids in, sampled ids and their log-probs out.

Engines (``HFEngine`` here; vLLM behind the same protocol) generate a batch of requests, each
with its own sampling parameters and seed, report the policy version of the weights that
sampled, and load new weights in place between calls (docs/design.md §5).

Sampling is a function of the request's seed, its prompt ids and the weights only — not of
timing or of which other requests share the batch — wherever the engine's numerics allow it
(the HF engine guarantees it exactly with ``batch_invariant=True``), so that two training modes
given the same seed roll out the same tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one request."""

    max_new_tokens: int
    """At most this many tokens (the request ends with ``finish_reason="length"``)."""
    temperature: float = 1.0
    """1.0 samples the policy itself (what RL trains); 0.0 is greedy (evaluation)."""
    stop_ids: tuple[int, ...] = ()
    """Generation stops after any of these ids (they are part of the output)."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One continuation to sample: ``prompt_ids`` exactly as the policy sees them."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    seed: int
    """Seeds this request's sampler (see ``request_seed``)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """What an engine sampled for one request."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """log π(token | context) of the distribution the sampler drew from (temperature-scaled
    logits; at temperature 1 the policy's own log-probs)."""
    finish_reason: str
    """``"stop"`` (a stop id was sampled) or ``"length"``."""
    policy_version: int
    """The version of the weights that sampled every token."""


class Engine(Protocol):
    """A rollout engine. Implementations don't inherit this; they match it."""

    policy_version: int
    max_context: int
    """Longest prompt + completion the model accepts."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Sample every request (one completion each, in order)."""
        ...

    def load_weights(self, flat: torch.Tensor, policy_version: int) -> None:
        """Copy a flat vector of the trainable parameters (the learner's order) into the
        model, in place, and report ``policy_version`` from now on."""
        ...

    def close(self) -> None:
        """Release the engine's resources (safe to call twice)."""
        ...


def generate_checked(
    requests: Sequence[GenerationRequest],
    generate_batch: Callable[[list], list[Completion]],
    *,
    max_context: int,
    batch_invariant: bool,
) -> list[Completion]:
    """What every engine's ``generate`` does around its own batched sampling: check each
    request, then sample them together or, batch-invariant, each alone."""
    for request in requests:
        check_request(request, max_context)
    if batch_invariant:
        return [generate_batch([request])[0] for request in requests]
    return generate_batch(list(requests))


def check_request(request: GenerationRequest, max_context: int) -> None:
    """ValueError unless ``request`` has a prompt and fits the engine's context window."""
    if not request.prompt_ids:
        raise ValueError("generate: a request needs at least one prompt token")
    if len(request.prompt_ids) + request.params.max_new_tokens > max_context:
        raise ValueError(
            f"generate: {len(request.prompt_ids)} prompt + {request.params.max_new_tokens} "
            f"new tokens exceed the context of {max_context}"
        )


def request_seed(run_seed: int, episode_id: str, turn: int) -> int:
    """The sampling seed of one turn of one episode: a function of the run's seed, the episode
    id (which names the step) and the turn only, never of timing."""
    digest = hashlib.sha256(f"{run_seed}/{episode_id}/{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def parameter_layout(model_dir: str | Path) -> tuple[list[str], list[torch.Size]]:
    """The checkpoint's trainable parameters as the learner flattens them: the names and
    shapes of ``model.parameters()`` of its transformers model (tied weights once), built on
    the meta device (no memory, no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(Path(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    named = list(model.named_parameters())
    return [name for name, _ in named], [p.shape for _, p in named]
