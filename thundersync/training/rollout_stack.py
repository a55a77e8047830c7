"""The rollout stack, built in one place: engine → batcher → policy agent → runner → driver.

The rollout worker (training), ``thundersync eval --checkpoint`` (``harness/policy_eval.py``)
and the agent-loop benchmark play episodes through the same stack (docs/design.md §5): an
engine behind a ``DynamicBatcher`` (requests that wait together are generated together), a
``PolicyAgent`` that turns a conversation into a request and a completion into an action, an
``EpisodeRunner`` over the env, and an ``EpisodeDriver`` that plays many episodes as
coroutines on one loop. What differs between the three is data (the sampling, the batch
window, what is recorded), so each says it to ``RolloutStack.build`` instead of wiring the
parts by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium

from environments.runner import EpisodeRunner, Sink
from environments.tasks import TaskSource
from thundersync.protocol import events as ev
from thundersync.training.agent import PolicyAgent
from thundersync.training.chat import ChatFormat
from thundersync.training.engines.batcher import BatchHook, DynamicBatcher
from thundersync.training.engines.engine import Engine
from thundersync.training.episodes import EpisodeDriver

DEFAULT_WINDOW_S = 0.005
"""How long the batcher waits for more requests once one arrives (``DynamicBatcher``)."""


@dataclass(frozen=True, slots=True)
class Sampling:
    """How the policy samples: ``seed`` seeds every request (with its episode and turn, so the
    same episode samples the same tokens whoever plays it)."""

    seed: int
    max_new_tokens: int
    temperature: float = 1.0


class RolloutStack:
    """An engine, its batcher and the policy agent on them; makes runners and drivers over
    them. Owns the engine: ``close`` stops the batcher's thread, then releases the engine."""

    def __init__(self, engine: Engine, batcher: DynamicBatcher, agent: PolicyAgent) -> None:
        self.engine = engine
        self.batcher = batcher
        self.agent = agent

    @classmethod
    def build(
        cls,
        engine: Engine,
        model_dir: str | Path,
        sampling: Sampling,
        *,
        max_batch_size: int,
        window_s: float = DEFAULT_WINDOW_S,
        on_batch: BatchHook | None = None,
        record: Callable[[ev.SpanRecorded], Any] | None = None,
    ) -> RolloutStack:
        """The stack on ``engine`` (which it owns from now on: released if building fails),
        with ``model_dir``'s tokenizer and chat template; ``on_batch`` sees every engine batch,
        ``record`` every span the agent records."""
        # torch and transformers load with the tokenizer: a command that builds no stack
        # (eval with a scripted agent, --help) does not pay for them
        from thundersync.models import load_tokenizer

        batcher: DynamicBatcher | None = None
        try:
            batcher = DynamicBatcher(
                engine, window_s=window_s, max_batch_size=max_batch_size, on_batch=on_batch
            )
            agent = PolicyAgent(
                batcher.generate,
                ChatFormat(load_tokenizer(model_dir)),
                policy_version=lambda: engine.policy_version,
                run_seed=sampling.seed,
                max_new_tokens=sampling.max_new_tokens,
                max_context=engine.max_context,
                temperature=sampling.temperature,
                record=record,
            )
        except BaseException:  # a failure here must not leave the engine (vLLM: its memory)
            try:
                if batcher is not None:
                    batcher.close()
            finally:
                engine.close()
            raise
        return cls(engine, batcher, agent)

    def runner(
        self,
        make_env: Callable[[], gymnasium.Env[Any, Any]],
        sink: Sink,
        *,
        tasks: TaskSource | None = None,
    ) -> EpisodeRunner:
        """A runner of ``make_env``'s episodes with this stack's agent, its events to ``sink``."""
        return EpisodeRunner(make_env, self.agent, sink, tasks=tasks)

    def driver(
        self, runner: EpisodeRunner, *, max_concurrency: int, max_prepared: int | None = None
    ) -> EpisodeDriver:
        """A driver that plays ``runner``'s episodes as coroutines, their requests batched
        by this stack's batcher (``shutdown`` it; the stack's ``close`` does not)."""
        return EpisodeDriver(
            runner, self.batcher, max_concurrency=max_concurrency, max_prepared=max_prepared
        )

    def close(self) -> None:
        """Stop the batcher's thread, then release the engine (safe to call twice)."""
        try:
            self.batcher.close()
        finally:
            self.engine.close()

    def __enter__(self) -> RolloutStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
