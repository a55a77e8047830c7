"""A checkpoint as an agent: the policy agent on an engine (hf or vllm), over tasks in sandboxes.

One ``PolicyEvaluator`` holds one engine (loaded once); ``load`` swaps another checkpoint's
weights in place (a run's checkpoints share an architecture), so evaluating every checkpoint
of a run costs one model load. Attempts are seeded per task and sample (``request_seed`` with
the evaluation's seed), so the same checkpoint, tasks and seed give the same episodes whether
``thundersync eval --checkpoint`` or ``thundersync compare`` runs them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from thundersync.cli_output import strict_json
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeKey
from thundersync.protocol.types import Trajectory
from thundersync.training import engines
from thundersync.training.engines.engine import parameter_layout


class PolicyEvaluator:
    """Runs a checkpoint's policy agent over tasks; a context manager (closes its engine)."""

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        seed: int = 0,
        max_new_tokens: int = 48,
        temperature: float = 1.0,
        concurrency: int = 32,
        device: str = "cpu",
        engine: str = "hf",
        dtype: str = "float32",
    ) -> None:
        from thundersync.training.rollout_stack import RolloutStack, Sampling

        self.checkpoint = Path(checkpoint)
        self.stack = RolloutStack.build(
            engines.build_engine(engine, self.checkpoint, dtype=dtype, device=device, seed=seed),
            self.checkpoint,
            Sampling(seed, max_new_tokens, temperature),
            max_batch_size=concurrency,
        )
        self.engine = self.stack.engine
        self.batcher = self.stack.batcher
        self.agent = self.stack.agent
        self.concurrency = concurrency

    def load(self, checkpoint: str | Path) -> None:
        """Evaluate ``checkpoint`` from now on (same architecture, weights loaded in place, on
        whichever engine this evaluator holds)."""
        from safetensors.torch import load_file

        state = load_file(Path(checkpoint) / "model.safetensors")
        names, _ = parameter_layout(self.checkpoint)  # the learner's flat order
        missing = [name for name in names if name not in state]
        if missing:
            raise ValueError(
                f"{checkpoint}: not a checkpoint of this architecture (missing {missing[:3]})"
            )
        dtype = state[names[0]].dtype
        flat = torch.cat([state[name].reshape(-1).to(dtype) for name in names])
        self.batcher.call(lambda engine: engine.load_weights(flat, engine.policy_version))
        self.checkpoint = Path(checkpoint)

    def run(
        self,
        tasks: Sequence[Any],
        make_env: Callable[[], Any],
        *,
        k: int,
        sink: Callable[[ev.Event], None] | None = None,
    ) -> list[list[Trajectory]]:
        """``k`` attempts per task, all concurrent (up to ``concurrency``); per task, in order."""
        runner = self.stack.runner(make_env, sink or (lambda event: None))
        return run_attempts(runner, tasks, k, concurrency=self.concurrency, batcher=self.batcher)

    def close(self) -> None:
        """Stop the batcher's thread, then release the engine (safe to call twice)."""
        self.stack.close()

    def __enter__(self) -> PolicyEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_attempts(
    runner: Any,
    tasks: Sequence[Any],
    k: int,
    *,
    concurrency: int,
    batcher: Any = None,
) -> list[list[Trajectory]]:
    """``k`` attempts per task, up to ``concurrency`` at once; per task, in order. Attempt s of
    task t is episode ``v-g{t}-e{s}`` with reset seed ``1000 t + s`` (and the policy's
    sampling seeded by that id), whoever runs it. Attempts run as training's do
    (``EpisodeDriver``): with the policy's ``batcher``, each batch closes once every live
    attempt has asked; without (agents that need no engine), each action is the agent's
    ``act`` on a thread."""
    from thundersync.training.episodes import EpisodeDriver

    keys = EpisodeKey.batch(None, len(tasks), k)  # an evaluation: ids v-g<t>-e<s>
    width = max(1, min(concurrency, len(keys)))
    driver = EpisodeDriver(runner, batcher, max_concurrency=width)
    try:
        futures = driver.submit_all(
            {
                "task": tasks[key.group],
                "group_id": key.group_id,
                "group_size": k,
                "episode_id": key.episode_id,
                "seed": key.group * 1000 + key.sample,
            }
            for key in keys
        )
        results = [future.result() for future in futures]
    finally:
        driver.shutdown()
    return [results[t * k : (t + 1) * k] for t in range(len(tasks))]


class Transcripts:
    """An agent that records each episode's conversation as text, for ``attempts.jsonl``."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.conversations: dict[str, list[tuple[str, str]]] = {}
        self._lock = threading.Lock()

    @property
    def policy_version(self) -> int:
        return self.agent.policy_version

    def act(self, task: Any, messages: Sequence[Any], *, episode_id: str) -> Any:
        return self._keep(
            self.agent.act(task, messages, episode_id=episode_id), messages, episode_id
        )

    def request(self, messages: Sequence[Any], *, episode_id: str) -> Any:
        return self.agent.request(messages, episode_id=episode_id)

    def action(
        self, completion: Any, messages: Sequence[Any], *, episode_id: str, **times: float | None
    ) -> Any:
        action = self.agent.action(completion, messages, episode_id=episode_id, **times)
        return self._keep(action, messages, episode_id)

    def _keep(self, action: Any, messages: Sequence[Any], episode_id: str) -> Any:
        with self._lock:
            self.conversations[episode_id] = [(m.role, m.content) for m in messages] + [
                ("assistant", action.text)
            ]
        return action

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        return self.agent.encode_prompt(text)

    def encode_observation(self, text: str) -> tuple[int, ...]:
        return self.agent.encode_observation(text)

    def write(self, path: Path, groups: Sequence[Sequence[Trajectory]]) -> None:
        """One JSON line per attempt: outcome, grade details (grading logs) and conversation."""

        with path.open("w", encoding="utf-8") as fh:
            for group in groups:
                for t in group:
                    record = {
                        "episode_id": t.episode_id,
                        "task_id": t.task_id,
                        "reward": t.reward,
                        "infra_failure": t.infra_failure,
                        "stop_reason": t.stop_reason,
                        "num_turns": len(t.turns),
                        "details": _plain(t.details),
                        "conversation": self.conversations.get(t.episode_id, []),
                    }
                    fh.write(strict_json(record, indent=None) + "\n")


def _plain(value: Any) -> Any:
    """JSON-able: containers kept, anything else as its string."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def eval_tasks(env_id: str, env_kwargs: dict[str, Any], num_tasks: int, *, seed: int = 0) -> Any:
    """``num_tasks`` distinct tasks of the env's held-out split, seeded, without making an env
    (an ``environments.splits.Selection``: its note says when they are not held-out)."""
    from environments.registry import task_source
    from environments.splits import select_tasks

    return select_tasks(task_source(env_id, **env_kwargs), num_tasks, seed=seed, name=env_id)
