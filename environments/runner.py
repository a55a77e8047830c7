"""EpisodeRunner: drives ShellEnvs with an agent and publishes the episode events (DESIGN §2).

Per episode, in this order: ``EpisodeStarted`` → for each action ``TurnCompleted`` (before the
tool runs) and ``ToolFinished`` (after; every non-final action has one, the final one only if
its command ran) → ``EpisodeCompleted`` (the last action is fixed; before grading starts,
thanks to ``defer_grading``) → ``RewardReady`` (after grading). An exception anywhere in an
episode (env, sandbox, agent) still yields this skeleton, ending in ``RewardReady`` with
``infra_failure=True`` and the error in ``details``; the runner never crashes on it and the
env (hence the sandbox) is closed on every path.

Unparseable actions get a ``ToolFinished`` too (``exit_code=None``, ``duration_s=0``): it
carries the corrective observation's ids, which are part of the trajectory.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from environments.agents import Agent, Message
from environments.tasks import Grade, Task
from thundersync.events import (
    EpisodeCompleted,
    EpisodeStarted,
    Event,
    RewardReady,
    ToolFinished,
    TurnCompleted,
)
from thundersync.types import StopReason, Trajectory, Turn

Sink = Callable[[Event], None]


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    """One finished episode: its trajectory (ids as the policy saw them) and its outcome."""

    trajectory: Trajectory
    task_id: str
    reward: float
    infra_failure: bool
    stop_reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def episode_id(self) -> str:
        return self.trajectory.episode_id


@dataclass(slots=True)
class _Episode:
    """Mutable state of one running episode (private to the runner)."""

    episode_id: str
    group_id: str
    group_size: int
    task_id: str = ""
    prompt_ids: tuple[int, ...] = ()
    turns: list[Turn] = field(default_factory=list)
    started: bool = False
    completed: bool = False


class SinkError(RuntimeError):
    """A subscriber of the runner's events raised: the consumer broke, not the episode. It
    propagates out of the runner (after the other episodes are stopped and their sandboxes
    removed) instead of being recorded as the episode's infrastructure failure."""


class RunCancelled(RuntimeError):
    """The run is stopping (an interrupt or another episode's sink error): the episode ends at
    its next turn boundary as an infrastructure failure."""


class EpisodeRunner:
    """Runs episodes of ``make_env()`` envs with ``agent``, publishing events to ``sink``.

    ``make_env`` returns a fresh ``ShellEnv`` (or a wrapper of one) per episode, since envs
    are not thread-safe; ``max_concurrency`` bounds how many episodes run at once. Episode
    and group ids are strings, unique within this runner.
    """

    def __init__(
        self,
        make_env: Callable[[], gym.Env],
        agent: Agent,
        sink: Sink,
        *,
        max_concurrency: int = 2,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.make_env = make_env
        self.agent = agent
        self.sink = sink
        self.max_concurrency = max_concurrency
        self._episode_ids = itertools.count()
        self._group_ids = itertools.count()
        self._ids_lock = threading.Lock()
        self._stopping = threading.Event()

    def new_group_id(self) -> str:
        with self._ids_lock:
            return f"group-{next(self._group_ids)}"

    def _new_episode_id(self) -> str:
        with self._ids_lock:
            return f"episode-{next(self._episode_ids)}"

    # --- groups ------------------------------------------------------------------------------

    def run_group(
        self, task: Task | None, group_size: int, *, seed: int | None = None
    ) -> list[EpisodeResult]:
        """``group_size`` episodes of one task (drawn from the env when None)."""
        return self.run_groups([task], group_size, seed=seed)[0]

    def run_groups(
        self, tasks: Sequence[Task | None], group_size: int, *, seed: int | None = None
    ) -> list[list[EpisodeResult]]:
        """One group of ``group_size`` episodes per task, all on a bounded thread pool.

        Results come back per group in ``tasks`` order. A None task is drawn from the env with
        a generator seeded from ``seed``, so every episode of a group plays the same task.
        """
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        rng = np.random.default_rng(seed)
        jobs = []
        for task in tasks:
            chosen = task if task is not None else self._draw_task(rng)
            group_id = self.new_group_id()
            for _ in range(group_size):
                episode_seed = int(rng.integers(2**31))
                jobs.append((chosen, group_id, episode_seed))
        pool = ThreadPoolExecutor(max_workers=self.max_concurrency)
        futures = [
            pool.submit(
                self.run_episode, task, group_id=group_id, group_size=group_size, seed=episode_seed
            )
            for task, group_id, episode_seed in jobs
        ]
        try:
            results = [future.result() for future in futures]
        except BaseException:
            # Ctrl-C, SIGTERM (the CLI turns it into SystemExit) or a sink error: queued
            # episodes never start, running ones stop at their next turn boundary, and we wait
            # for them so that every sandbox is removed before the exception leaves.
            self._stopping.set()
            pool.shutdown(wait=True, cancel_futures=True)
            self._stopping.clear()
            raise
        pool.shutdown(wait=True)
        return [results[i : i + group_size] for i in range(0, len(results), group_size)]

    def _draw_task(self, rng: np.random.Generator) -> Task:
        env = self.make_env()
        try:
            return env.unwrapped.draw_task(rng)
        finally:
            env.close()

    # --- one episode -------------------------------------------------------------------------

    def run_episode(
        self,
        task: Task | None = None,
        *,
        group_id: str | None = None,
        group_size: int = 1,
        seed: int | None = None,
    ) -> EpisodeResult:
        """Run one episode to the end and grade it; never raises for an episode's failure."""
        episode = _Episode(self._new_episode_id(), group_id or self.new_group_id(), group_size)
        if task is not None:
            episode.task_id = task.task_id
        env: gym.Env | None = None
        try:
            env = self.make_env()
            return self._play(env, episode, task, seed)
        except SinkError:
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            return self._conclude(episode, StopReason.ERROR, Grade(0.0, True, {"error": error}))
        finally:
            if env is not None:
                env.close()

    def _play(
        self, env: gym.Env, episode: _Episode, task: Task | None, seed: int | None
    ) -> EpisodeResult:
        options: dict[str, Any] = {"defer_grading": True}
        if task is not None:
            options["task"] = task
        observation, info = env.reset(seed=seed, options=options)
        task = env.unwrapped.task
        episode.task_id = task.task_id
        episode.prompt_ids = tuple(self.agent.encode(observation))
        self._start(episode)
        if info.get("infra_failure"):
            failed = Grade(0.0, infra_failure=True, details={"error": info.get("error")})
            return self._conclude(episode, StopReason.ERROR, failed)
        messages = [Message("user", observation)]
        while True:
            if self._stopping.is_set():
                raise RunCancelled("the run was interrupted")
            action = self.agent.act(task, messages)
            turn = len(episode.turns)
            version = self._version(action.policy_version)
            self._publish(
                TurnCompleted(
                    episode_id=episode.episode_id,
                    turn=turn,
                    action_ids=action.token_ids,
                    action_logprobs=action.logprobs,
                    policy_version=version,
                )
            )
            # Recorded before the tool runs, so a failing step still counts this published turn.
            episode.turns.append(Turn(action.token_ids, action.logprobs, version))
            observation, _, terminated, truncated, info = env.step(action.text)
            is_last = terminated or truncated
            observation_ids: tuple[int, ...] = ()
            if "tool" in info or not is_last:
                observation_ids = tuple(self.agent.encode(observation))
                tool = info.get("tool", {})
                self._publish(
                    ToolFinished(
                        episode_id=episode.episode_id,
                        turn=turn,
                        observation_ids=observation_ids,
                        duration_s=float(tool.get("duration_s", 0.0)),
                        exit_code=tool.get("exit_code"),
                        timed_out=bool(tool.get("timed_out", False)),
                    )
                )
            episode.turns[-1] = Turn(action.token_ids, action.logprobs, version, observation_ids)
            messages += [Message("assistant", action.text), Message("user", observation)]
            if is_last:
                break
        reason = StopReason(info["termination_reason"])
        self._complete(episode, reason)
        grade = env.unwrapped.grade()
        if grade.infra_failure:
            reason = StopReason.ERROR
        return self._conclude(episode, reason, grade)

    def _version(self, action_version: int | None) -> int:
        return self.agent.policy_version if action_version is None else action_version

    def _publish(self, event: Event) -> None:
        try:
            self.sink(event)
        except Exception as exc:
            raise SinkError(f"event sink failed on {type(event).__name__}: {exc}") from exc

    def _start(self, episode: _Episode) -> None:
        episode.started = True
        self._publish(
            EpisodeStarted(
                episode_id=episode.episode_id,
                group_id=episode.group_id,
                group_size=episode.group_size,
                task_id=episode.task_id,
                prompt_ids=episode.prompt_ids,
                policy_version=self.agent.policy_version,
            )
        )

    def _complete(self, episode: _Episode, reason: StopReason) -> None:
        episode.completed = True
        self._publish(
            EpisodeCompleted(
                episode_id=episode.episode_id,
                num_turns=len(episode.turns),
                stop_reason=reason.value,
            )
        )

    def _conclude(self, episode: _Episode, reason: StopReason, grade: Grade) -> EpisodeResult:
        """Publish whatever of the skeleton is missing, then ``RewardReady``."""
        if not episode.started:
            self._start(episode)
        if not episode.completed:
            self._complete(episode, reason)
        details = dict(grade.details)
        self._publish(
            RewardReady(
                episode_id=episode.episode_id,
                reward=float(grade.reward),
                infra_failure=grade.infra_failure,
                details=details,
            )
        )
        trajectory = Trajectory(
            episode_id=episode.episode_id,
            group_id=episode.group_id,
            group_size=episode.group_size,
            task_id=episode.task_id,
            prompt_ids=episode.prompt_ids,
            turns=tuple(episode.turns),
            reward=float(grade.reward),
            infra_failure=grade.infra_failure,
            stop_reason=reason.value,
            details=details,
        )
        return EpisodeResult(
            trajectory,
            episode.task_id,
            float(grade.reward),
            grade.infra_failure,
            reason.value,
            details,
        )
