"""Weights from the learner to the rollout engine after each step, through shared memory (CPU).

The trainer writes its parameters into one flat shared vector under a lock and then tells the
rollout worker the new version; the worker copies the vector into its engine between two
generation batches (``DynamicBatcher.call``), so no batch samples with half-copied weights and
the engine's ``policy_version`` names exactly the weights that sampled each token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.multiprocessing as mp

from thundersync.training.engines.engine import Engine

CONTEXT = mp.get_context("spawn")
"""The workers' start method (``workers.CONTEXT`` is the same object): the lock and the
version must be made by the context that starts the rollout worker."""


class SharedWeights:
    """A model's parameters (``model.parameters()`` order) as a flat shared-memory vector."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(numel, dtype=params[0].dtype).share_memory_()
        self.lock = CONTEXT.Lock()
        self.version = CONTEXT.Value("q", -1)

    def publish(self, params: Sequence[torch.Tensor], policy_version: int) -> tuple:
        """Copy ``params`` in (the trainer, after ``learner.step()``); nothing for the
        control message to carry (``ObjectStoreWeights`` sends a reference)."""
        with self.lock, torch.no_grad():
            offset = 0
            for p in params:
                n = p.numel()
                self.flat[offset : offset + n].copy_(p.detach().reshape(-1))
                offset += n
            self.version.value = policy_version
        return ()

    def load_into(self, engine: Engine) -> int:
        """Copy the latest published weights into ``engine``; returns their version."""
        with self.lock:
            version = int(self.version.value)
            if version < 0:
                raise RuntimeError("no weights were published yet")
            engine.load_weights(self.flat, version)
        return version
