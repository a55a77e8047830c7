"""Tasks are data: a task set yields typed tasks; grading turns a sandbox's state into a reward."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


@dataclass(frozen=True, slots=True)
class GradingContext:
    """What ``ShellEnv`` hands a task's ``grade`` besides the episode's sandbox.

    A context object rather than more arguments, so that the protocol can grow a field
    without breaking every task (the env protocol is versioned: see ``PROTOCOL_VERSION``).
    """

    fresh_sandbox: Callable[[], Sandbox]
    """Makes a new sandbox like the episode's (same spec and kind); every sandbox it made is
    closed by the env when ``grade`` returns. Graders that must not trust the agent's final
    state (SWE-bench's official flow, strict grading) copy the agent's work into one."""
    strict: bool = True
    """Strict grading (docs/design.md §6, the default for training): grade in a fresh sandbox
    with only the agent's work copied in, test files from the task, tools from a read-only
    layer and a pinned environment, and flag tampering with test infrastructure
    (``details["tamper_suspected"]``, scored 0). ``False`` grades as the benchmark's own
    harness does, so that published numbers stay comparable."""


PROTOCOL_VERSION = 2
"""Version of the ``Task`` protocol. 2: ``sandbox_spec(kind)`` and ``grade(sandbox,
context)`` take their arguments explicitly (1 probed optional keywords)."""


class Task(Protocol):
    """One agentic task. Implementations don't inherit this; they match it."""

    task_id: str
    instruction: str
    """The prompt text shown to the agent."""
    max_turns: int
    timeout_s: float
    """Per-command timeout for the agent's tool calls."""

    def sandbox_spec(self, kind: str | None) -> SandboxSpec:
        """How to build this task's sandbox. ``kind`` is the env's sandbox kind (``"bwrap"``,
        ``"docker"``) or None for a custom sandbox factory, so a task that needs a Docker
        build can say so by name under bubblewrap (``NeedsDockerError``)."""
        ...

    def setup(self, sandbox: Sandbox) -> None:
        """Prepare a fresh sandbox before the first turn (raise SandboxError on failure)."""
        ...

    def grade(self, sandbox: Sandbox, context: GradingContext) -> Grade:
        """Turn the episode's final state into a reward (after the last action).

        ``sandbox`` is the episode's sandbox as the agent left it; ``context`` gives a
        factory for fresh sandboxes and says whether grading is strict. Raise SandboxError
        only when the sandbox itself failed (an infrastructure failure); anything the agent
        caused scores 0 with the reason in ``details``.
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
