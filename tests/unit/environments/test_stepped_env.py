"""ShellEnv playing a task of several steps (``environments.task_steps``) with a fake sandbox:
a submission grades the step and shows the next instruction, the gate ends the episode, other
ends grade the step they were in, a failed step setup stops the episode, a sandbox failure is
an infrastructure failure, and each step's own command timeout applies."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from environments.actions import format_action
from environments.agents import SUBMIT_ACTION
from environments.core import ShellEnv
from environments.sandboxes.protocol import SandboxError
from environments.task_steps import StepSetupFailed
from environments.tasks import Grade
from environments.terminal_bench.steps import combine
from tests.unit.environments.shell_fakes import FileTask, LocalSandbox, SandboxMaker


@dataclass
class SteppedFileTask(FileTask):
    """Step ``i`` is solved iff answer.txt holds ``answers[i]``; its gate is ``gates[i]``."""

    answers: tuple[str, ...] = ("one", "two", "three")
    gates: tuple[float | None, ...] = (1.0, None, None)
    timeouts: tuple[float, ...] = (5.0, 7.0, 9.0)
    index: int | None = None
    setup_fails: Exception | None = None
    started: list[int] = field(default_factory=list)

    @property
    def num_steps(self) -> int:
        return len(self.answers) if self.index is None else 0

    def step_task(self, index: int) -> SteppedFileTask:
        return dataclasses.replace(
            self,
            instruction=f"step {index}: write {self.answers[index]}",
            expected=self.answers[index],
            timeout_s=self.timeouts[index],
            index=index,
        )

    def start_step(self, sandbox: LocalSandbox, index: int) -> None:
        self.started.append(index)
        if self.setup_fails is not None:
            raise self.setup_fails

    def stop_after(self, index: int, grade: Grade) -> str | None:
        gate = self.gates[index]
        return f"gate {index}" if gate is not None and grade.reward < gate else None

    def combine_steps(
        self, grades: Sequence[Grade], stopped: str | None, *, gated: bool = False
    ) -> Grade:
        reward, _ = combine("mean", grades)
        details: dict[str, Any] = {"graded": [g.reward for g in grades], "stopped": stopped}
        if any(g.infra_failure for g in grades):
            return Grade(0.0, True, {**details, "error": "a step's grading failed"})
        return Grade(reward, details=details)


def write(word: str) -> str:
    return format_action(f"echo {word} > answer.txt")


def make(task: SteppedFileTask, **kwargs: Any) -> tuple[ShellEnv, list[str]]:
    calls: list[str] = []
    env = ShellEnv([task], sandbox=SandboxMaker(), **kwargs)
    first, _ = env.reset(
        options={"task": task, "before_grading": lambda obs, info: calls.append(obs)}
    )
    assert first == task.instruction
    return env, calls


def test_each_submission_grades_the_step_and_shows_the_next_instruction() -> None:
    task = SteppedFileTask(instruction="step 0: write one")
    env, calls = make(task)
    assert env.step(write("one"))[1:4] == (0.0, False, False)
    observation, reward, terminated, truncated, info = env.step(SUBMIT_ACTION)
    assert observation == "step 1: write two" and reward == 0.0
    assert not terminated and not truncated and info["step_finished"] == {"index": 0, "reward": 1.0}
    assert env._command_timeout() == 7.0  # step 1's own
    env.step(SUBMIT_ACTION)  # step 1 unsolved, no gate: step 2 is played
    env.step(write("three"))
    observation, reward, terminated, truncated, info = env.step(SUBMIT_ACTION)
    assert terminated and reward == 2 / 3
    assert info["grade_details"] == {"graded": [1.0, 0.0, 1.0], "stopped": None}
    assert task.started == [1, 2] and calls == [""]  # before_grading once, before the last
    env.close()


def test_a_failed_gate_ends_the_episode_after_grading_the_step() -> None:
    task = SteppedFileTask()
    env, calls = make(task)
    observation, reward, terminated, _, info = env.step(SUBMIT_ACTION)
    assert terminated and reward == 0.0 and observation == ""
    assert info["grade_details"] == {"graded": [0.0], "stopped": "gate 0"}
    assert task.started == [] and calls == [""]
    env.close()


def test_a_turn_limit_grades_the_step_it_was_in_and_plays_no_more() -> None:
    task = SteppedFileTask(gates=(None, None, None))
    env, _ = make(task, max_turns=2)
    env.step(write("one"))
    _, reward, terminated, truncated, info = env.step(write("nothing"))
    assert truncated and not terminated and reward == 0.0
    assert info["grade_details"]["stopped"] == "the episode ended (max_turns) in step 1"
    assert task.started == []
    env.close()


def test_a_step_setup_that_fails_stops_the_episode_on_the_steps_graded() -> None:
    task = SteppedFileTask(setup_fails=StepSetupFailed("step b: setup.sh exited 1"))
    env, _ = make(task)
    env.step(write("one"))
    _, reward, terminated, _, info = env.step(SUBMIT_ACTION)
    assert terminated and reward == 1.0 and not info["infra_failure"]
    assert info["grade_details"]["stopped"] == "step b: setup.sh exited 1"
    env.close()


def test_a_sandbox_failure_between_steps_is_an_infrastructure_failure() -> None:
    task = SteppedFileTask(setup_fails=SandboxError("the container died"))
    env, _ = make(task)
    env.step(write("one"))
    _, reward, _, truncated, info = env.step(SUBMIT_ACTION)
    assert truncated and reward == 0.0 and info["infra_failure"]
    assert "the container died" in info["error"]
    env.close()
