"""Our envs as TRL environments: ``GRPOTrainer(environment_factory=trl_environment(env_id))``.

TRL 1.16's ``GRPOTrainer`` takes an ``environment_factory``: a callable of no arguments that it
calls once per concurrent rollout, keeping the instances in a pool and calling ``reset`` again
for every later rollout ("construct once, reset often"). Its contract, as ``grpo_trainer.py``
reads it:

- ``reset(**row)`` gets the dataset row of the rollout (``prompt`` and any other column) and
  may return a string, which TRL appends to the row's last user message;
- every public method of the class other than ``reset`` and ``get_reward`` becomes a tool: its
  name, type hints and Google-style docstring make the tool schema in the prompt, and TRL calls
  it with the arguments of each tool call the model makes (an exception is shown to the model
  as ``{"error": ...}``);
- ``get_reward()`` (no argument) is called once per finished rollout; TRL adds it as a reward
  function named after the class, with weight 1. ``None`` marks the rollout unscorable: TRL
  leaves it out of its group's baseline and gives it advantage 0.

``trl_environment`` returns such a class for a registered env id. An instance owns one episode
of one env at a time, hence one sandbox: ``reset`` makes a fresh env (``gymnasium.make``),
draws a task (seeded by the row's ``seed`` column, or the task named by its ``task`` column)
and returns the instruction; the one tool, ``bash(command)``, is one ``env.step`` of a fenced
command, run in the sandbox; ``get_reward`` grades through the task's own grader (strict unless
asked otherwise). A rollout that stops without ending the episode (the model answered without
a tool call, or TRL's length or tool-iteration limits stopped it) is ended with
``end_episode(StopReason.SUBMITTED)`` and graded as it stands; an infrastructure failure gives
``None``. The env is closed as soon as the episode is graded, by the next ``reset``, by ``with``
on the instance, or when the instance is dropped; nothing here imports TRL.

GRPO compares the rollouts of one prompt, so they must share a task: give the trainer a dataset
with a ``seed`` column (``task_rows``). Without one (TRL's placeholder dataset), each rollout
draws its own task.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

from thundersync.protocol.types import StopReason


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a rollout's episode ended and what our grader gave it (``instance.outcome``)."""

    task_id: str
    """The task the episode ran."""
    reward: float | None
    """The grader's reward; None after an infrastructure failure (not a score to train on)."""
    stop_reason: StopReason | None
    """Why the episode ended (``SUBMITTED`` too when the rollout stopped without ending it)."""
    infra_failure: bool
    """The sandbox or the grader failed; ``details["error"]`` says how."""
    details: dict[str, Any] = field(default_factory=dict)
    """The grader's ``grade_details`` (and ``error`` on an infrastructure failure)."""


class _Slot:
    """The live env of an instance, kept apart so that a finalizer can close it without
    holding the instance alive."""

    def __init__(self) -> None:
        self.env: Any = None

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.close()


class TrlEnvironment:
    """Base of the classes ``trl_environment`` makes; see the module docstring.

    Public methods are TRL tools, so this class has exactly one (``bash``) besides ``reset``
    and ``get_reward``; closing is ``with instance:`` or dropping it."""

    env_id: str = ""
    _make_env: Callable[[], Any]

    def __init__(self) -> None:
        self._slot = _Slot()
        self._finalizer = weakref.finalize(self, self._slot.close)
        self._task_id: str | None = None
        self._outcome: Outcome | None = None

    def __enter__(self) -> TrlEnvironment:
        return self

    def __exit__(self, *exc: object) -> None:
        self._slot.close()

    @property
    def outcome(self) -> Outcome | None:
        """The last episode's outcome once it ended (None while it runs or before ``reset``)."""
        return self._outcome

    def reset(self, **row: Any) -> str:
        """Start an episode in a fresh env; returns the task's instruction (or, when making
        the sandbox failed, the env's infrastructure-failure message).

        ``row`` is TRL's dataset row: ``seed`` (an integer >= 0) seeds the task draw, ``task``
        (a task id or index) picks a task; other columns (``prompt``...) are ignored."""
        seed, options = _episode_choice(row, self.env_id)
        self._slot.close()
        self._task_id, self._outcome = None, None
        env = self._slot.env = type(self)._make_env()
        if not callable(getattr(env.unwrapped, "end_episode", None)):
            self._slot.close()
            raise TypeError(
                f"env {self.env_id}: {type(env.unwrapped).__name__} has no end_episode(reason); "
                "the TRL adapter needs a ShellEnv (environments.core)"
            )
        try:
            observation, info = env.reset(seed=seed, options=options)
        except BaseException:
            self._slot.close()
            raise
        self._task_id = str(info.get("task_id", ""))
        if info.get("infra_failure"):
            self._end(None, info)
        return observation

    def bash(self, command: str) -> str:
        """Run one shell command in the task's sandbox and return its output.

        Files persist between calls; shell state (cd, variables) does not. A failed command's
        output ends with its exit code. The episode ends when a command's output starts with
        the line THUNDERSYNC_SUBMIT, when the command is exactly `submit`, or at the task's
        turn limit; then the answer is graded.

        Args:
            command: The command, run with bash -c in the task's working directory.

        Returns:
            The command's output (stdout and stderr).
        """
        env = self._slot.env
        if env is None:
            if self._outcome is None:
                raise RuntimeError(f"env {self.env_id}: bash() before reset()")
            return f"[the episode is over ({self._outcome.stop_reason}); no command ran]"
        if not isinstance(command, str) or not command.strip():
            raise ValueError(f"bash: command must be a non-empty string, got {command!r}")
        if "```" in command:
            raise ValueError("bash: command must not contain ``` (a fence ends the action)")
        try:
            observation, reward, terminated, truncated, info = env.step(f"```bash\n{command}\n```")
        except BaseException:
            self._slot.close()
            raise
        if terminated or truncated:
            self._end(reward, info)
            reason = info.get("termination_reason")
            if reason is not StopReason.SUBMITTED:
                observation += f"\n[the episode is over: {reason}]"
        return observation

    def get_reward(self) -> float | None:
        """Our grader's reward for this rollout's episode (ended and graded here if the rollout
        stopped first); None after an infrastructure failure."""
        if self._outcome is not None:
            return self._outcome.reward
        env = self._slot.env
        if env is None:
            raise RuntimeError(f"env {self.env_id}: get_reward() before reset()")
        try:
            _, reward, _, _, info = env.unwrapped.end_episode(StopReason.SUBMITTED)
        except BaseException:
            self._slot.close()
            raise
        return self._end(reward, info)

    def _end(self, reward: float | None, info: dict[str, Any]) -> float | None:
        """Record the graded episode, close its env (the sandbox goes now, not at the next
        ``reset``: a pool of idle instances holds no sandbox) and return its reward."""
        failed = bool(info.get("infra_failure"))
        details = dict(info.get("grade_details") or {})
        if failed:
            details["error"] = info.get("error")
        self._outcome = Outcome(
            task_id=self._task_id or "",
            reward=None if failed or reward is None else float(reward),
            stop_reason=info.get("termination_reason") or (StopReason.ERROR if failed else None),
            infra_failure=failed,
            details=details,
        )
        self._slot.close()
        return self._outcome.reward


def _episode_choice(row: dict[str, Any], env_id: str) -> tuple[int | None, dict[str, Any]]:
    """The ``reset`` seed and options a TRL dataset row asks for (ValueError naming the
    column and value otherwise)."""
    seed = row.get("seed")  # None: the env draws its task from fresh entropy
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral)):
        raise ValueError(f"env {env_id}: row column 'seed': expected an integer >= 0, got {seed!r}")
    if seed is not None and seed < 0:
        raise ValueError(f"env {env_id}: row column 'seed': expected an integer >= 0, got {seed}")
    options = {"task": row["task"]} if row.get("task") is not None else {}
    return (None if seed is None else int(seed)), options


def trl_environment(
    env_id: str, *, strict_grading: bool = True, **env_kwargs: Any
) -> type[TrlEnvironment]:
    """A TRL ``environment_factory`` for the registered env ``env_id``: a class whose instances
    each run one episode at a time of ``gymnasium.make(env_id, strict_grading=...,
    **env_kwargs)`` (see the module docstring). TRL logs its reward under the class name,
    the env's name and version (``ToySum_v0``). ValueError for an unknown id."""
    from environments.registry import episode_envs, require_env

    require_env(env_id, option="env_id")
    make = episode_envs(env_id, strict_grading=strict_grading, **env_kwargs)
    name = re.sub(r"\W", "_", env_id.rsplit("/", 1)[-1])
    return type(
        name,
        (TrlEnvironment,),
        {"env_id": env_id, "_make_env": staticmethod(make), "__module__": __name__},
    )


def task_rows(num_rows: int, *, seed: int = 0) -> list[dict[str, Any]]:
    """``num_rows`` TRL dataset rows (``datasets.Dataset.from_list``), each an empty user
    prompt that ``reset`` fills with its task's instruction and a distinct ``seed``, so that
    the rollouts TRL groups under one row share one task."""
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
        raise ValueError(f"num_rows: expected an integer >= 1, got {num_rows!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected an integer >= 0, got {seed!r}")
    return [
        {"prompt": [{"role": "user", "content": ""}], "seed": seed + i} for i in range(num_rows)
    ]
