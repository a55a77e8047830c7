"""One OpenEnv session of ``thundersync serve``: a registered env behind OpenEnv's ``Environment``.

``reset(seed, episode_id, task_id, strict_grading)`` resets the Gymnasium env (the seed draws
the task exactly as ``gymnasium.make(id).reset(seed=seed)`` does) and returns the instruction;
``step`` plays the reply; ``close`` closes the env, removing its sandbox. ``Sessions`` tracks
the live ones so that stopping the server closes them all.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import gymnasium
from openenv.core.env_server.interfaces import Environment

from thundersync.interop.openenv_wire import EpisodeState, TextAction, TextObservation


class Sessions:
    """The served envs alive now: what stopping the server closes, and what tests wait on."""

    def __init__(self) -> None:
        self._live: set[ServedEnv] = set()
        self._changed = threading.Condition()

    def add(self, env: ServedEnv) -> None:
        with self._changed:
            self._live.add(env)
            self._changed.notify_all()

    def discard(self, env: ServedEnv) -> None:
        with self._changed:
            self._live.discard(env)
            self._changed.notify_all()

    def __len__(self) -> int:
        with self._changed:
            return len(self._live)

    def wait_for(self, count: int, timeout: float) -> bool:
        """Whether exactly ``count`` sessions are alive within ``timeout`` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._live) == count, timeout)

    def close_all(self) -> None:
        with self._changed:
            live = list(self._live)
        for env in live:
            env.close()


class ServedEnv(Environment[TextAction, TextObservation, EpisodeState]):
    """One session's env: ``gymnasium.make(env_id, **kwargs)`` behind OpenEnv's API."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # one env, hence one sandbox, per session

    def __init__(self, env_id: str, kwargs: dict[str, Any], sessions: Sessions) -> None:
        super().__init__()
        self._env = gymnasium.make(env_id, disable_env_checker=True, **kwargs)
        self._strict = bool(getattr(self._env.unwrapped, "strict_grading", True))
        self._state = EpisodeState()
        self._sessions = sessions
        self._closed = False
        sessions.add(self)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        strict_grading: bool | None = None,
        **unknown: Any,
    ) -> TextObservation:
        """``strict_grading``: None keeps the served env's own setting (strict by default)."""
        if unknown:
            raise ValueError(
                f"reset: unknown argument(s) {sorted(unknown)}; expected seed, episode_id, "
                "task_id, strict_grading"
            )
        strict = self._strict if strict_grading is None else bool(strict_grading)
        if hasattr(self._env.unwrapped, "strict_grading"):
            self._env.unwrapped.strict_grading = strict
        options = {"task": task_id} if task_id is not None else None
        text, info = self._env.reset(seed=seed, options=options)
        task = str(info.get("task_id", ""))
        self._state = EpisodeState(episode_id=episode_id or uuid.uuid4().hex, task_id=task)
        return TextObservation(
            text=text,
            task_id=task,
            infra_failure=bool(info.get("infra_failure", False)),
            error=info.get("error"),
            strict_grading=strict,
        )

    def step(self, action: TextAction, timeout_s: float | None = None, **_: Any) -> TextObservation:
        """``timeout_s`` is not used: each tool call has its task's own timeout."""
        text, reward, terminated, truncated, info = self._env.step(action.text)
        self._state.step_count += 1
        done = bool(terminated or truncated)
        reason = info.get("termination_reason")
        return TextObservation(
            text=text,
            reward=float(reward) if done else None,
            done=done,
            task_id=self._state.task_id,
            turn=info.get("turn"),
            truncated=bool(truncated),
            termination_reason=None if reason is None else str(getattr(reason, "value", reason)),
            infra_failure=bool(info.get("infra_failure", False)),
            error=info.get("error"),
            format_error=info.get("format_error"),
            tool=_jsonable(info.get("tool")),
            grade_details=_jsonable(info.get("grade_details")),
            strict_grading=bool(getattr(self._env.unwrapped, "strict_grading", self._strict)),
        )

    @property
    def state(self) -> EpisodeState:
        return self._state

    def close(self) -> None:
        """Close the env (its sandbox removed); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._env.close()
        finally:
            self._sessions.discard(self)


def _jsonable(value: Any) -> Any:
    """``value`` as JSON carries it (a grader's odd detail as its repr, not a crash)."""
    if value is None:
        return None
    return json.loads(json.dumps(value, default=repr))
