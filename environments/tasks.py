"""Tasks are data: a task set yields typed tasks; grading turns a sandbox's state into a reward."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from environments.sandboxes.protocol import Sandbox, SandboxSpec


class TaskFormatError(ValueError):
    """A task file is malformed. The message names the file and the field, and what was
    expected, e.g. ``tasks/foo/task.toml: field 'verifier.timeout_sec': expected a positive
    number, got 'abc'``."""

    def __init__(self, path: object, field_name: str, problem: str) -> None:
        self.path = str(path)
        self.field = field_name
        super().__init__(f"{path}: field {field_name!r}: {problem}")


@dataclass(frozen=True, slots=True)
class Grade:
    """The outcome of grading. ``infra_failure``: the grader could not run (the reward means
    nothing and must not be trained on); ``details``: per-test or per-metric results."""

    reward: float
    infra_failure: bool = False
    details: dict[str, Any] = field(default_factory=dict)


class Task(Protocol):
    """One agentic task. Implementations don't inherit this; they match it."""

    task_id: str
    instruction: str
    """The prompt text shown to the agent."""
    max_turns: int
    timeout_s: float
    """Per-command timeout for the agent's tool calls."""

    def sandbox_spec(self) -> SandboxSpec:
        """How to build this task's sandbox."""
        ...

    def setup(self, sandbox: Sandbox) -> None:
        """Prepare a fresh sandbox before the first turn (raise SandboxError on failure)."""
        ...

    def grade(self, sandbox: Sandbox) -> Grade:
        """Run the task's tests in the sandbox after the episode and return the reward.

        A task may also accept a keyword ``fresh_sandbox``: a zero-argument callable making a
        new sandbox like the episode's. ShellEnv passes it when the signature takes it, so a
        task can grade only the agent's diff in a clean sandbox, as SWE-bench's official
        harness does (the agent's final state then cannot touch the grader).
        """
        ...

    def reference_solution(self) -> list[str]:
        """Shell commands that solve the task (what the ``oracle`` agent runs)."""
        ...


class TaskSet(Protocol):
    """A collection of tasks, e.g. a folder of Terminal-Bench tasks or SWE-bench rows."""

    name: str

    def __iter__(self) -> Iterator[Task]: ...

    def __len__(self) -> int: ...


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TaskList(Generic[T]):
    """A named, fixed sequence of tasks (a ``TaskSet``): what every loader returns."""

    name: str
    tasks: tuple[T, ...]

    def __iter__(self) -> Iterator[T]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def get(self, task_id: str) -> T:
        """The task with this id; KeyError naming the set and the known ids otherwise."""
        for task in self.tasks:
            if task.task_id == task_id:  # type: ignore[attr-defined]
                return task
        known = [t.task_id for t in self.tasks]  # type: ignore[attr-defined]
        raise KeyError(f"{self.name}: no task {task_id!r}; known: {known}")
