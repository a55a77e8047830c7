"""ShellEnv: a Gymnasium env, text in and text out, that runs one task's episode in a sandbox."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from environments.actions import (
    ActionFormatError,
    format_error_message,
    is_submission_output,
    parse_action,
    strip_submission_marker,
)
from environments.live_sandboxes import LiveSandboxes, SandboxFactory
from environments.sandboxes.protocol import (
    AgentBrokeSandbox,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from environments.task_steps import SteppedTask, StepSetupFailed, stepped
from environments.tasks import (
    TRAIN,
    FixedTasks,
    Grade,
    GradingContext,
    Task,
    TaskSource,
    as_current,
    checked_grade,
)
from environments.text_space import MAX_ACTION_CHARS, MAX_OBSERVATION_CHARS, UnicodeText
from thundersync.protocol.types import StopReason

BeforeGrading = Callable[[str, dict[str, Any]], None]

INSTANT_STEPS = "instant_steps"
"""An env's ``metadata`` key: True when its ``reset``, ``step`` and ``close`` return without
waiting on anything (in-process tools, no latency, no subprocess), so that a driver may advance
its episodes cooperatively on one thread instead of a thread each (``EpisodeRunner.episode``).
Absent means False: a sandboxed tool or a grader blocks its thread."""


class ShellEnv(gym.Env[str, str]):
    """One agentic task per episode: the agent sends shell commands, the env returns output.

    Observations and actions are text (``UnicodeText``). The action protocol is the bash-tool
    protocol of ``environments.actions``: exactly one ```bash block per action; ``submit``
    ends the episode without a tool call, output starting with ``THUNDERSYNC_SUBMIT`` ends it
    after the tool call.

    ``reset(seed=None, options=None) -> (instruction, info)``
        Closes the previous sandbox, picks the task (``options["task"]``: a Task, a task id or
        an index into ``tasks``; otherwise one drawn with ``self.np_random``), makes a fresh
        sandbox and runs ``task.setup``. ``options["before_grading"]``: a callable
        ``(observation, info)`` that the terminal step calls once the last action is fixed
        (and its tool call, if any, has run) and *before* grading starts, with what ``step``
        will return minus the grade: an event publisher uses it to say "all tokens known"
        while a slow grader runs. info: ``task_id``, ``infra_failure``. If making the sandbox
        or the setup raises ``SandboxError``, the observation is an error message, info has
        ``infra_failure=True`` and ``error``, and the next ``step`` ends the episode.
        ``options["episode_id"]`` names the episode's folder under ``artifacts_dir``
        (``GradingContext.artifacts_dir``: where a task keeps files of its sandbox, Harbor's
        ``artifacts``; None, the default, keeps none).

    ``step(action) -> (observation, reward, terminated, truncated, info)``
        Parses the action and runs its command with the task's timeout (capped by what is left
        of ``max_episode_s``). The observation is the command's output, followed by
        ``[exit code N]`` when it failed or ``[command timed out after S s]``; for an
        unparseable action it is a corrective message (no tool runs). ``terminated`` is True
        on submission; ``truncated`` on ``max_turns`` actions, on ``max_episode_s`` elapsed,
        after ``max_format_errors`` consecutive unparseable actions, or on an infrastructure
        failure. info: ``turn`` (from 0), ``tool`` (``exit_code``, ``timed_out``,
        ``duration_s``, ``output_truncated``; only when a command ran), ``format_error`` (when
        unparseable), ``termination_reason`` (a ``StopReason``, None while the episode runs),
        ``infra_failure`` and, on an infrastructure failure, ``error``.

        Reward is 0.0 on every non-terminal step. On the terminal step (terminated or
        truncated) the final sandbox state is graded with ``task.grade(sandbox, context)``
        and the graded reward is returned — so reward wrappers see it — with
        ``grade_details`` in info. The context carries a factory for fresh sandboxes made
        like the episode's (closed when grading returns) and ``strict_grading``. A grading
        ``SandboxError`` gives reward 0.0 and ``infra_failure=True`` (never train on it).
        After an infrastructure failure nothing is graded.

        A task of several steps (``environments.task_steps``: Harbor's ``[[steps]]``) plays them in
        this one episode and sandbox: a submission grades the current step
        (``options["step_graded"]``, a callable, gets its index and Grade) and, unless it was the
        last or the task's gate stops the episode, the next step is prepared and its instruction is
        the observation (reward 0; info ``step_finished``: the step's index and reward). Any other
        end grades the step it was in. The terminal reward is the task's ``combine_steps`` of the
        graded steps (a Harbor task's ``grade_details["steps"]``). ``before_grading`` is called
        once, before the grading of a step that cannot be followed by another, else after the
        grading whose gate stopped the episode.

    ``strict_grading`` (default True, what training uses) asks tasks to grade strictly:
    docs/design.md §6 and ``environments.tasks.GradingContext``.

    ``interrupt(reason)`` may be called from any thread: it closes every sandbox of the env at
    once (killing a running command), so a ``reset``, ``step`` or grading running in another
    thread returns promptly with an infrastructure failure; the env then makes no more
    sandboxes (make a new env). This is what ``EpisodeRunner.cancel`` uses.

    ``close()`` removes the sandbox (safe to call twice); a sandbox that could not be removed
    raises SandboxError. Wrappers forward nothing: use
    ``env.get_wrapper_attr("task")`` (or ``env.unwrapped``) for ``task`` and ``draw_task``.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    observation_space: UnicodeText
    action_space: UnicodeText

    @classmethod
    def task_source(cls, **kwargs: Any) -> TaskSource | None:
        """This env's tasks by split, without making the env (``kwargs``: the env's, those
        it does not use ignored), or None when only a made env knows them (its ``tasks``).

        An env with a held-out split overrides this, e.g. returning
        ``FixedTasks(name, train=(...), heldout=(...))`` and passing the same source to
        ``ShellEnv.__init__``; ``environments.registry.task_source`` asks it first."""
        return None

    def __init__(
        self,
        tasks: Iterable[Task] | TaskSource | None = None,
        *,
        sandbox: str | SandboxFactory = "bwrap",
        max_turns: int | None = None,
        max_episode_s: float | None = None,
        max_format_errors: int = 3,
        strict_grading: bool = True,
        artifacts_dir: str | Path | None = None,
    ) -> None:
        if max_format_errors < 1:
            raise ValueError(f"max_format_errors must be >= 1, got {max_format_errors}")
        if hasattr(tasks, "splits") and hasattr(tasks, "draw"):  # a TaskSource
            # duck-typed as before (a plugin's source need not match the whole protocol)
            self.source: TaskSource = tasks  # type: ignore[assignment]
        else:  # every task checked against the protocol now: a mismatch refuses the env
            self.source = FixedTasks(type(self).__name__, tuple(tasks or ()))
        self.tasks: list[Task] = list(self.source.tasks(TRAIN) or ())
        self.max_turns = max_turns
        self.max_episode_s = max_episode_s
        self.max_format_errors = max_format_errors
        self.strict_grading = strict_grading
        self.artifacts_dir = Path(artifacts_dir) if artifacts_dir is not None else None
        self._episode_name = "episode"
        self._num_resets = 0
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.action_space = UnicodeText(MAX_ACTION_CHARS)
        self._sandbox_kind = sandbox
        self._sandbox: Sandbox | None = None
        self._task: Task | None = None
        self._before_grading: BeforeGrading | None = None
        self._num_turns = 0
        self._num_format_errors = 0
        self._started = 0.0
        self._done = False
        self._failure: str | None = None
        self._step = 0  # the current step of a stepped task
        self._step_grades: list[Grade] = []
        self._sandboxes = LiveSandboxes(sandbox)

    @property
    def sandbox_kind(self) -> str | None:
        """The sandbox kind the episodes run in (``bwrap``, ``docker``), or None when the env
        brings its own (a factory: ToySum's in-process tools), so no engine need be here."""
        return self._sandbox_kind if isinstance(self._sandbox_kind, str) else None

    @property
    def task(self) -> Task:
        """The current episode's task (after ``reset``)."""
        if self._task is None:
            raise gym.error.ResetNeeded("call reset() before using the task")
        return self._task

    # --- reset -------------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        self._close_sandbox()
        self._task = self._select_task(options.get("task"))
        self._before_grading = options.get("before_grading")
        self._step_graded = options.get("step_graded") or (lambda index, grade: None)
        self._num_resets += 1
        self._episode_name = _folder_name(options.get("episode_id"), self._num_resets)
        self._num_turns = 0
        self._num_format_errors = 0
        self._started = time.monotonic()
        self._done = False
        self._failure = None
        self._step = 0
        self._step_grades = []
        info: dict[str, Any] = {"task_id": self._task.task_id, "infra_failure": False}
        try:
            self._sandbox = self._sandboxes.make(self._task_spec())
            self._task.setup(self._sandbox)
        except SandboxError as exc:
            self._fail(exc)
            info.update(infra_failure=True, error=self._failure)
            return self._clip(f"Infrastructure failure: {self._failure}"), info
        except BaseException:
            self._close_sandbox()
            raise
        return self._clip(self._task.instruction), info

    def start_episode_clock(self) -> None:
        """Count ``max_episode_s`` from now instead of from ``reset``: a runner that reset
        the env ahead of the episode (``EpisodeRunner.prepare``) calls it when the episode
        begins, so the wait for its start is not the agent's time."""
        self._started = time.monotonic()

    def draw_task(self, rng: np.random.Generator) -> Task:
        """A training task drawn with ``rng`` (what ``reset`` uses when no task is given)."""
        if not self.tasks and self.source.tasks(TRAIN) is not None:
            raise ValueError("this env has no tasks: pass tasks=... or options={'task': Task}")
        return self.source.draw(rng, TRAIN)

    def _select_task(self, choice: Any) -> Task:
        if choice is None:
            return self.draw_task(self.np_random)
        if isinstance(choice, str):
            for task in self.tasks:
                if task.task_id == choice:
                    return task
            known = [task.task_id for task in self.tasks]
            raise ValueError(f"options['task']: unknown task id {choice!r}; known: {known}")
        if isinstance(choice, int | np.integer) and not isinstance(choice, bool):
            if not 0 <= choice < len(self.tasks):
                raise ValueError(
                    f"options['task']: index {choice} out of range 0..{len(self.tasks) - 1}"
                )
            return self.tasks[int(choice)]
        return as_current(choice)

    def _task_spec(self) -> SandboxSpec:
        if self._task is None:
            raise gym.error.ResetNeeded("call reset() before making a sandbox")
        kind = self._sandbox_kind if isinstance(self._sandbox_kind, str) else None
        return self._task.sandbox_spec(kind)

    def interrupt(self, reason: str = "interrupted") -> None:
        """Close every sandbox of this env now, from any thread (see the class docstring)."""
        self._sandboxes.interrupt(reason)

    # --- step --------------------------------------------------------------------------------

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task is None or self._done:
            raise gym.error.ResetNeeded("the episode is over (or never started): call reset()")
        info: dict[str, Any] = {"turn": self._num_turns, "infra_failure": False}
        self._num_turns += 1
        if self._failure is not None:
            return self._end_with_failure(info)
        try:
            parsed = parse_action(action)
        except ActionFormatError as exc:
            self._num_format_errors += 1
            info["format_error"] = str(exc)
            reason: StopReason | None
            if self._num_format_errors >= self.max_format_errors:
                reason = StopReason.FORMAT_ERRORS
            else:
                reason = self._limit_reason()
            return self._finish_step(format_error_message(str(exc)), info, reason)
        self._num_format_errors = 0
        if parsed.is_submit:
            return self._finish_step("", info, StopReason.SUBMITTED)
        timeout = self._command_timeout()
        try:
            result = self._execute(parsed.command, timeout)
        except SandboxError as exc:
            self._fail(exc)
            return self._end_with_failure(info)
        except AgentBrokeSandbox as exc:  # the agent's doing: its observation, not infra
            broken = f"[the sandbox no longer runs commands: {exc}]"
            result = ExecResult(output=broken, exit_code=None, timed_out=False, duration_s=0.0)
        info["tool"] = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "duration_s": result.duration_s,
            "output_truncated": result.truncated,
        }
        if is_submission_output(result.output):
            return self._finish_step(
                strip_submission_marker(result.output), info, StopReason.SUBMITTED
            )
        return self._finish_step(self._render(result, timeout), info, self._limit_reason())

    def end_episode(self, reason: StopReason) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """End the running episode without an action (the agent cannot act: its context is
        full, ``StopReason.LENGTH``): grade it and return what a terminal ``step`` returns
        (``truncated`` is True). ``before_grading`` is called as for a terminal step."""
        if self._task is None or self._done:
            raise gym.error.ResetNeeded("the episode is over (or never started): call reset()")
        info: dict[str, Any] = {"turn": self._num_turns, "infra_failure": False}
        if self._failure is not None:
            return self._end_with_failure(info)
        return self._finish_step("", info, reason)

    def _execute(self, command: str, timeout: float) -> ExecResult:
        """Run one agent command in the sandbox (subclasses add latency here)."""
        if self._sandbox is None:
            raise SandboxError("the episode's sandbox is gone")
        return self._sandbox.execute(command, timeout)

    def _current_task(self) -> Task:
        """The task whose step is playing: the episode's, or its current step's."""
        steps = stepped(self.task)
        return steps.step_task(self._step) if steps is not None else self.task

    def _command_timeout(self) -> float:
        timeout = float(self._current_task().timeout_s)
        if self.max_episode_s is not None:
            remaining = self.max_episode_s - (time.monotonic() - self._started)
            timeout = max(0.1, min(timeout, remaining))
        return timeout

    def _limit_reason(self) -> StopReason | None:
        max_turns = self.max_turns if self.max_turns is not None else self.task.max_turns
        if self._num_turns >= max_turns:
            return StopReason.MAX_TURNS
        elapsed = time.monotonic() - self._started
        if self.max_episode_s is not None and elapsed >= self.max_episode_s:
            return StopReason.TIME_LIMIT
        return None

    def _render(self, result: ExecResult, timeout: float) -> str:
        if result.timed_out:
            return f"{result.output}\n[command timed out after {timeout:g} s]"
        if result.exit_code != 0:
            return f"{result.output}\n[exit code {result.exit_code}]"
        return result.output

    def _finish_step(
        self, observation: str, info: dict[str, Any], reason: StopReason | None
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info["termination_reason"] = reason
        observation = self._clip(observation)
        reward = 0.0
        steps = stepped(self._task)
        if reason is not None and steps is not None:
            return self._finish_stepped(steps, observation, info, reason)
        if reason is not None:
            self._done = True
            if self._before_grading is not None:
                self._before_grading(observation, dict(info))
            grade = self._graded()
            reward = float(grade.reward)
            info["infra_failure"] = grade.infra_failure
            info["grade_details"] = dict(grade.details)
            if grade.infra_failure:
                info["termination_reason"] = StopReason.ERROR
                info["error"] = grade.details.get("error")
        terminated = reason is StopReason.SUBMITTED
        truncated = reason is not None and not terminated
        return observation, reward, terminated, truncated, info

    def _finish_stepped(
        self, steps: SteppedTask, observation: str, info: dict[str, Any], reason: StopReason
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The end of a step of a stepped task: grade it, then play the next or end."""
        self._done = True
        index = self._step
        last = index + 1 >= steps.num_steps or reason is not StopReason.SUBMITTED
        if last and self._before_grading is not None:
            self._before_grading(observation, dict(info))
        grade = self._graded(steps.step_task(index))
        self._step_grades.append(grade)
        self._step_graded(index, grade)
        stopped = None
        if index + 1 < steps.num_steps and reason is not StopReason.SUBMITTED:
            stopped = f"the episode ended ({reason.value}) in step {index + 1}"
        gated = False
        if not last and not grade.infra_failure:
            stopped = steps.stop_after(index, grade)
            gated = stopped is not None
        if not last and stopped is None and not grade.infra_failure:
            try:
                if self._sandbox is None:
                    raise SandboxError("the episode's sandbox is gone")
                steps.start_step(self._sandbox, index + 1)
            except StepSetupFailed as exc:
                stopped = str(exc)
            except SandboxError as exc:
                self._fail(exc)
                return self._end_with_failure(info)
            else:
                self._step, self._done = index + 1, False
                info["step_finished"] = {"index": index, "reward": float(grade.reward)}
                return self._clip(steps.step_task(index + 1).instruction), 0.0, False, False, info
        if not last and self._before_grading is not None:
            self._before_grading(observation, dict(info))
        final = checked_grade(
            steps.combine_steps(self._step_grades, stopped, gated=gated), self.task.task_id
        )
        info["infra_failure"] = final.infra_failure
        info["grade_details"] = dict(final.details)
        if final.infra_failure:
            info["termination_reason"] = StopReason.ERROR
            info["error"] = final.details.get("error")
        terminated = reason is StopReason.SUBMITTED
        return observation, float(final.reward), terminated, not terminated, info

    def _end_with_failure(self, info: dict[str, Any]) -> tuple[str, float, bool, bool, dict]:
        self._done = True
        info.update(infra_failure=True, error=self._failure, termination_reason=StopReason.ERROR)
        return self._clip(f"Infrastructure failure: {self._failure}"), 0.0, False, True, info

    def _fail(self, exc: BaseException) -> None:
        self._failure = f"{type(exc).__name__}: {exc}"
        try:
            self._close_sandbox()
        except SandboxError as close_exc:
            self._failure += f"; removing the sandbox failed too: {close_exc}"

    # --- grading and cleanup -----------------------------------------------------------------

    def _graded(self, task: Task | None = None) -> Grade:
        """Grade the finished episode's final sandbox state (as ``task``, default the
        episode's: a step of it). A ``SandboxError`` while grading gives ``Grade(0.0,
        infra_failure=True)`` with the error in ``details``."""
        task = task or self._task
        if task is None or self._sandbox is None:
            raise gym.error.ResetNeeded("grading needs a finished episode with its sandbox")
        fresh: list[Sandbox] = []

        def make_from(spec: SandboxSpec) -> Sandbox:
            sandbox = self._sandboxes.make(spec)
            fresh.append(sandbox)
            return sandbox

        context = GradingContext(
            fresh_sandbox=lambda: make_from(self._task_spec()),
            strict=self.strict_grading,
            sandbox_kind=self._sandbox_kind if isinstance(self._sandbox_kind, str) else None,
            make_sandbox=make_from,
            artifacts_dir=self.artifacts_dir / self._episode_name if self.artifacts_dir else None,
        )
        try:
            grade = task.grade(self._sandbox, context)
        except SandboxError as exc:
            self._fail(exc)
            return Grade(0.0, infra_failure=True, details={"error": self._failure})
        except AgentBrokeSandbox as exc:  # who failed decides the label: the agent did
            return Grade(0.0, details={"agent_failure": str(exc), "reason": str(exc)})
        finally:
            for sandbox in fresh:
                self._sandboxes.release(sandbox)
        return checked_grade(grade, task.task_id)

    def close(self) -> None:
        self._close_sandbox()
        super().close()

    def _close_sandbox(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            self._sandboxes.release(sandbox)

    def _clip(self, text: str) -> str:
        return text[: self.observation_space.max_length]


def _folder_name(episode_id: object, num_resets: int) -> str:
    """The episode's folder under ``artifacts_dir``: its id (``options["episode_id"]``, as the
    runner names it) with anything but letters, digits, ``.``, ``_``, ``-`` replaced; without
    one, ``episode-<n>`` for this env's n-th reset, so no episode overwrites another's."""
    name = str(episode_id) if episode_id is not None else f"episode-{num_resets}"
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name).lstrip(".")
    return name[:128] or "episode"
