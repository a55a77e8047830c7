"""EpisodeRunner: drives ShellEnvs with an agent and publishes the episode events (design.md §2).

Per episode, in this order: ``EpisodeStarted`` → for each action ``TurnCompleted`` (before the tool
runs) and ``ToolFinished`` (after; every non-final action has one, the final one only if its command
ran) → ``EpisodeCompleted`` (the last action is fixed; published from the env's ``before_grading``
hook, so before grading starts) → ``RewardReady`` (the reward ``step`` returned, so reward wrappers
apply); a multi-step task's ``EpisodeStepGraded`` as each step is graded, before the next step's
turns. An exception anywhere in an episode (env, sandbox, agent) still yields this skeleton, ending
in ``RewardReady`` with ``infra_failure=True`` and the error in ``details``; the runner never
crashes on it and the env (hence the sandbox) is closed on every path, before ``RewardReady``: an
episode whose sandbox could not be removed (a lost Docker daemon) is an infrastructure failure too.

Cancellation: ``cancel(reason)``, from any thread, ends every running episode at once. The runner
keeps a registry of the envs it is running and interrupts each (``ShellEnv.interrupt`` closes its
sandboxes, killing a running command), so an ``execute`` in flight returns within moments instead of
at its timeout. Every episode not yet concluded comes back as an infrastructure failure with
``details["cancelled"]`` (never trained on), and so does every ``run_episode`` call after it: a
cancelled runner stays cancelled. ``run_groups`` then returns all its groups (a partial result);
``cancel_on_signals()`` makes SIGINT and SIGTERM do this.

Unparseable actions get a ``ToolFinished`` too (``exit_code=None``, ``duration_s=0``): it
carries the corrective observation's ids, which are part of the trajectory.

``run_episode`` is ``drive(runner.episode(...), agent)``: an episode is a generator that yields
an ``ActionNeeded`` wherever the agent's next action is due and is sent the ``Action`` (or
thrown what ``act`` raised). A driver may advance many such generators as coroutines on one
loop, asking the policy for their actions in batches (``thundersync.training.episodes``); each
``ActionNeeded`` says whether the env declared that its steps answer at once
(``environments.core.INSTANT_STEPS``), so the driver knows whether sending the action may
block.

Preparing ahead: ``prepare(...)`` makes and resets an episode's env now (its sandbox started,
the task set up, the prompt encoded) and publishes nothing; ``episode(prepared=...)`` later
plays it from there, its events exactly those of an episode started then. The rollout worker
prepares the next step's episodes while the learner trains, so that sandboxes do not start on
the engine's path (docs/design.md §5). What making or resetting the env raised is the
episode's infrastructure failure when it plays, as it would have been.
"""

from __future__ import annotations

import itertools
import signal
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import gymnasium as gym

from environments.agents import Action, Agent, ContextExhausted, Message
from environments.core import INSTANT_STEPS
from environments.episode_state import (
    EpisodeState,
    PreparedEpisode,
    RunCancelled,
    SinkError,
    describe,
    outcome,
)
from environments.episode_steps import ActionNeeded, EpisodeSteps, drive, step_graded
from environments.groups import run_groups
from environments.sandboxes.protocol import SandboxError
from environments.tasks import Grade, Task, TaskSource
from thundersync.protocol.events import (
    EpisodeCompleted,
    EpisodeStarted,
    Event,
    RewardReady,
    ToolFinished,
    TurnCompleted,
)
from thundersync.protocol.types import StopReason, Trajectory

Sink = Callable[[Event], None]


class EpisodeRunner:
    """Runs episodes of ``make_env()`` envs with ``agent``, publishing events to ``sink``.

    ``make_env`` returns a fresh ``ShellEnv`` (or a wrapper of one) per episode, since envs
    are not thread-safe; ``max_concurrency`` bounds how many episodes run at once. Episode
    and group ids are strings, unique within this runner.

    A training loop that calls ``run_episode`` from threads of its own stops them all with
    ``runner.cancel(reason)`` from any thread (its shutdown path, a watchdog, a signal
    handler's helper thread): each call returns within moments, its trajectory an
    infrastructure failure with ``details["cancelled"]``, and every sandbox is removed by the
    time it returns. Nothing needs registering: the runner tracks the envs it made.
    """

    def __init__(
        self,
        make_env: Callable[[], gym.Env],
        agent: Agent,
        sink: Sink,
        *,
        max_concurrency: int = 2,
        tasks: TaskSource | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.make_env = make_env
        self.tasks = tasks
        """Where a None task is drawn from (its training split); None: from a made env."""
        self.agent = agent
        self.sink = sink
        self.max_concurrency = max_concurrency
        self._episode_ids = itertools.count()
        self._group_ids = itertools.count()
        self._ids_lock = threading.Lock()
        self._stopping = threading.Event()
        self._cancel_reason: str | None = None
        self._live_envs: dict[int, gym.Env] = {}  # what cancel() interrupts
        self._live_lock = threading.Lock()

    def new_group_id(self) -> str:
        with self._ids_lock:
            return f"group-{next(self._group_ids)}"

    def _new_episode_id(self) -> str:
        with self._ids_lock:
            return f"episode-{next(self._episode_ids)}"

    # --- cancellation ------------------------------------------------------------------------

    @property
    def cancelled(self) -> str | None:
        """The reason given to ``cancel``, or None while the runner has not been cancelled."""
        return self._cancel_reason

    def cancel(self, reason: str = "cancelled") -> None:
        """End every running episode now and every later one at once (see the module
        docstring). Thread-safe and idempotent; returns once every live env is interrupted
        (their sandboxes closed, in parallel). Not from a signal handler that interrupted this
        runner's own thread: use ``cancel_on_signals``, which calls it from a thread."""
        with self._live_lock:
            self._cancel_reason = self._cancel_reason or reason
            self._stopping.set()
            envs = list(self._live_envs.values())
        interrupts = [env.get_wrapper_attr("interrupt") for env in envs]
        threads = [threading.Thread(target=stop, args=(reason,)) for stop in interrupts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    @contextmanager
    def cancel_on_signals(
        self, signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM)
    ) -> Iterator[list[int]]:
        """While the block runs, the first of ``signums`` cancels the runner (from a thread)
        instead of raising, so the block's ``run_groups`` returns a partial result. Yields the
        list of signals received. Only in the main thread (elsewhere it does nothing); the
        previous handlers are back, and the cancel done, when the block exits."""
        received: list[int] = []
        if threading.current_thread() is not threading.main_thread():
            yield received
            return
        cancellers: list[threading.Thread] = []

        def handle(signum: int, frame: object) -> None:
            received.append(signum)
            if len(received) == 1:
                name = signal.Signals(signum).name
                cancellers.append(threading.Thread(target=self.cancel, args=(name,)))
                cancellers[0].start()

        previous = {signum: signal.signal(signum, handle) for signum in signums}
        try:
            yield received
        finally:
            for thread in cancellers:
                thread.join()
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    # --- groups (environments/groups.py) -------------------------------------------------------

    def run_group(
        self, task: Task | None, group_size: int, *, seed: int | None = None
    ) -> list[Trajectory]:
        """``group_size`` episodes of one task (drawn when None): ``environments.groups``."""
        return run_groups(self, [task], group_size, seed=seed)[0]

    def run_groups(
        self, tasks: Sequence[Task | None], group_size: int, *, seed: int | None = None
    ) -> list[list[Trajectory]]:
        """One group of ``group_size`` episodes per task, on a bounded thread pool, per group
        in ``tasks`` order (``environments.groups.run_groups``)."""
        return run_groups(self, tasks, group_size, seed=seed)

    # --- one episode -------------------------------------------------------------------------

    def run_episode(
        self,
        task: Task | None = None,
        *,
        group_id: str | None = None,
        group_size: int = 1,
        seed: int | None = None,
        episode_id: str | None = None,
    ) -> Trajectory:
        """Run one episode to the end and grade it; never raises for an episode's failure.
        ``episode_id`` and ``group_id`` default to fresh ids of this runner."""
        return drive(
            self.episode(
                task, group_id=group_id, group_size=group_size, seed=seed, episode_id=episode_id
            ),
            self.agent,
        )

    def episode(
        self,
        task: Task | None = None,
        *,
        group_id: str | None = None,
        group_size: int = 1,
        seed: int | None = None,
        episode_id: str | None = None,
        prepared: PreparedEpisode | None = None,
    ) -> EpisodeSteps:
        """``run_episode`` as a generator: yields an ``ActionNeeded`` for each action, is sent
        the ``Action`` (or thrown what producing it raised), returns the ``Trajectory``. Closing
        it early closes its env. With ``prepared`` (from ``prepare``, whose arguments it
        carries: the others are ignored) the episode plays in the env made then."""
        if prepared is None:
            episode = self._new_episode(task, group_id, group_size, episode_id)
        else:
            episode, task, seed = prepared.episode, prepared.task, prepared.seed
        try:
            reason, grade = yield from self._run_in_env(episode, task, seed, prepared)
        except SinkError:
            raise
        except Exception as exc:
            reason, grade = StopReason.ERROR, Grade(0.0, True, {"error": describe(exc)})
        if self._cancel_reason is not None:
            # Whatever the episode returned once its sandboxes were closed under it is no
            # grade: a grader that swallowed the error must not turn it into a reward.
            details = {**grade.details, "cancelled": self._cancel_reason}
            cause = details.get("error")
            details["error"] = f"RunCancelled: {self._cancel_reason}"
            if cause and "RunCancelled" not in str(cause):
                details["error"] += f" ({cause})"
            reason, grade = StopReason.ERROR, Grade(0.0, infra_failure=True, details=details)
        return self._conclude(episode, reason, grade)

    def prepare(
        self,
        task: Task | None = None,
        *,
        group_id: str | None = None,
        group_size: int = 1,
        seed: int | None = None,
        episode_id: str | None = None,
    ) -> PreparedEpisode:
        """Make and reset the env of the episode these arguments (``episode``'s) describe, now,
        publishing nothing; never raises for the env's failure (it is the episode's, when it
        plays). The env is the runner's from here: ``cancel`` interrupts it."""
        episode = self._new_episode(task, group_id, group_size, episode_id)
        prepared = PreparedEpisode(episode, task, seed)
        try:
            prepared.env = self._make_env()
        except Exception as exc:
            prepared.error = exc
            return prepared
        try:
            prepared.reset = self._reset(prepared.env, episode, task, seed)
        except BaseException as exc:
            error = self._close_env(prepared.env)
            if error is not None:
                exc.add_note(error)
            if not isinstance(exc, Exception):
                raise
            prepared.env, prepared.error = None, exc
        return prepared

    def discard(self, prepared: PreparedEpisode) -> None:
        """Close the env of a prepared episode that will not play (SandboxError when its
        sandbox could not be removed)."""
        env, prepared.env = prepared.env, None
        if env is not None and (error := self._close_env(env)) is not None:
            raise SandboxError(error)

    def _new_episode(
        self, task: Task | None, group_id: str | None, group_size: int, episode_id: str | None
    ) -> EpisodeState:
        episode = EpisodeState(
            episode_id or self._new_episode_id(), group_id or self.new_group_id(), group_size
        )
        if task is not None:
            episode.task_id = task.task_id
        return episode

    def _make_env(self) -> gym.Env:
        """A fresh env, registered for ``cancel``."""
        if self._stopping.is_set():
            raise RunCancelled(f"the run was cancelled ({self._cancel_reason})")
        env = self.make_env()
        with self._live_lock:
            self._live_envs[id(env)] = env
        if self._stopping.is_set():  # cancel() came before the registration: not seen
            self._close_env(env)
            raise RunCancelled(f"the run was cancelled ({self._cancel_reason})")
        return env

    def _run_in_env(
        self,
        episode: EpisodeState,
        task: Task | None,
        seed: int | None,
        prepared: PreparedEpisode | None,
    ) -> Generator[ActionNeeded, Action, tuple[StopReason, Grade]]:
        """Play the episode in a fresh env (or the prepared one), registered for ``cancel``;
        closed on every path."""
        if prepared is None:
            env, reset = self._make_env(), None
        elif prepared.error is not None:
            raise prepared.error
        else:
            taken, reset, prepared.env = prepared.env, prepared.reset, None
            if taken is None:
                raise ValueError(f"the prepared episode {episode.episode_id} was already played")
            env = taken
        try:
            if self._stopping.is_set():
                raise RunCancelled(f"the run was cancelled ({self._cancel_reason})")
            reason, grade = yield from self._play(env, episode, task, seed, reset)
        except BaseException as exc:
            error = self._close_env(env)
            if error is not None:
                exc.add_note(error)
            raise
        error = self._close_env(env)
        if error is not None and not grade.infra_failure:
            return StopReason.ERROR, Grade(0.0, True, {**grade.details, "error": error})
        return reason, grade

    def _close_env(self, env: gym.Env) -> str | None:
        """Unregister and close ``env``; what went wrong, if anything."""
        with self._live_lock:
            self._live_envs.pop(id(env), None)
        try:
            env.close()
        except Exception as exc:
            return f"the episode's sandbox could not be removed: {describe(exc)}"
        return None

    def _reset(
        self, env: gym.Env, episode: EpisodeState, task: Task | None, seed: int | None
    ) -> tuple[str, dict[str, Any]]:
        """``env.reset`` for ``episode``, its prompt encoded; what reset returned."""

        def before_grading(observation: str, info: dict[str, Any]) -> None:
            if "tool" in info:
                self._tool_finished(episode, observation, info)
            self._complete(episode, StopReason(info["termination_reason"]))

        options: dict[str, Any] = {
            "before_grading": before_grading,
            "step_graded": step_graded(lambda e: self._publish(e, episode), episode.episode_id),
            "episode_id": episode.episode_id,
        }
        if task is not None:
            options["task"] = task
        observation, info = env.reset(seed=seed, options=options)
        episode.task_id = env.get_wrapper_attr("task").task_id
        episode.prompt_ids = tuple(self.agent.encode_prompt(observation))
        return observation, info

    def _play(
        self,
        env: gym.Env,
        episode: EpisodeState,
        task: Task | None,
        seed: int | None,
        reset: tuple[str, dict[str, Any]] | None,
    ) -> Generator[ActionNeeded, Action, tuple[StopReason, Grade]]:
        """The episode in ``env``, reset now or (``reset``: what it returned) ahead."""
        if reset is None:
            observation, info = self._reset(env, episode, task, seed)
        else:
            observation, info = reset
            # the episode's time budget counts from now, not from when it was prepared
            if (restart := getattr(env.unwrapped, "start_episode_clock", None)) is not None:
                restart()
        task = env.get_wrapper_attr("task")
        self._start(episode)
        if info.get("infra_failure"):
            return StopReason.ERROR, Grade(
                0.0, infra_failure=True, details={"error": info.get("error")}
            )
        messages = [Message("user", observation, episode.prompt_ids)]
        instant = bool(env.metadata.get(INSTANT_STEPS))
        while True:
            if self._stopping.is_set():
                raise RunCancelled(f"the run was cancelled ({self._cancel_reason})")
            try:
                action = yield ActionNeeded(task, messages, episode.episode_id, instant)
            except ContextExhausted as exc:
                if not episode.num_turns:  # nothing to train on: the prompt alone fills the window
                    return StopReason.LENGTH, Grade(0.0, True, {"error": str(exc)})
                end = env.get_wrapper_attr("end_episode")
                observation, reward, terminated, truncated, info = end(StopReason.LENGTH)
                break
            # Recorded before the tool runs, so a failing step still counts this published turn.
            self._publish(
                TurnCompleted(
                    episode_id=episode.episode_id,
                    turn=episode.num_turns,
                    action_ids=action.token_ids,
                    action_logprobs=action.logprobs,
                    policy_version=self._version(action.policy_version),
                ),
                episode,
            )
            observation, reward, terminated, truncated, info = env.step(action.text)
            if terminated or truncated:
                break
            observation_ids = self._tool_finished(episode, observation, info)
            messages += [
                Message("assistant", action.text, action.token_ids),
                Message("user", observation, observation_ids),
            ]
        return outcome(reward, info)

    def _tool_finished(
        self, episode: EpisodeState, observation: str, info: dict[str, Any]
    ) -> tuple[int, ...]:
        """Publish the observation of the episode's last action (a tool's output, or the
        corrective message of an unparseable action) and record it in the trajectory."""
        observation_ids = tuple(self.agent.encode_observation(observation))
        tool = info.get("tool", {})
        self._publish(
            ToolFinished(
                episode_id=episode.episode_id,
                turn=episode.num_turns - 1,
                observation_ids=observation_ids,
                duration_s=float(tool.get("duration_s", 0.0)),
                exit_code=tool.get("exit_code"),
                timed_out=bool(tool.get("timed_out", False)),
            ),
            episode,
        )
        return observation_ids

    def _version(self, action_version: int | None) -> int:
        return self.agent.policy_version if action_version is None else action_version

    def _publish(self, event: Event, episode: EpisodeState) -> None:
        """Send ``event`` to the sink; once sent, it is part of the episode's record."""
        try:
            self.sink(event)
        except Exception as exc:
            raise SinkError(f"event sink failed on {type(event).__name__}: {exc}") from exc
        episode.record.fold(event)

    def _start(self, episode: EpisodeState) -> None:
        self._publish(
            EpisodeStarted(
                episode_id=episode.episode_id,
                group_id=episode.group_id,
                group_size=episode.group_size,
                task_id=episode.task_id,
                prompt_ids=episode.prompt_ids,
                policy_version=self.agent.policy_version,
            ),
            episode,
        )

    def _complete(self, episode: EpisodeState, reason: StopReason) -> None:
        self._publish(
            EpisodeCompleted(
                episode_id=episode.episode_id,
                num_turns=episode.num_turns,
                stop_reason=reason.value,
            ),
            episode,
        )

    def _conclude(self, episode: EpisodeState, reason: StopReason, grade: Grade) -> Trajectory:
        """Publish whatever of the skeleton is missing, then ``RewardReady``."""
        if episode.record.started is None:
            self._start(episode)
        if episode.record.completed is None:
            self._complete(episode, reason)
        self._publish(
            RewardReady(
                episode_id=episode.episode_id,
                reward=float(grade.reward),
                infra_failure=grade.infra_failure,
                details=dict(grade.details),
            ),
            episode,
        )
        # The stop reason is the episode's outcome (a grading failure after the episode ended
        # is ``error``), which its ``EpisodeCompleted`` could not know yet.
        return replace(episode.record.trajectory(), stop_reason=reason.value)
