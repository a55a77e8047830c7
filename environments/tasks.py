"""Tasks are data: a task set yields typed tasks; grading turns a sandbox's state into a reward.

A ``TaskSource`` lists and draws an env's tasks by split (``train``, ``heldout``) without making
an env; an env is then made for a task (``env.reset(options={"task": task})``). The ``Task``
protocol is what third-party packages implement, so it is versioned (``PROTOCOL_VERSION``):
``as_current`` adapts a task written for an older version, or refuses it with one line naming
the method, the expected signature and the version, before any episode runs.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from environments.sandboxes.protocol import Sandbox, SandboxSpec
from environments.splits import HELDOUT, MAX_DRAWS, SPLITS, TRAIN, heldout_by_hash
from environments.splits import select_tasks as select_tasks  # tests import it from here


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


def checked_grade(grade: Any, task_id: str) -> Grade:
    """A grader's result as a trainable ``Grade``, or an infrastructure failure naming what
    was wrong: a reward that is not a finite real number (one NaN would poison every update
    it reached), or not a ``Grade`` at all, is the grader's bug, never the agent's score."""
    reward = getattr(grade, "reward", None)
    is_real = isinstance(reward, int | float) and not isinstance(reward, bool)
    if isinstance(grade, Grade) and is_real and math.isfinite(grade.reward):
        return grade
    problem = (
        f"reward {reward!r} is not a finite number"
        if isinstance(grade, Grade)
        else f"returned {type(grade).__name__}, not a Grade"
    )
    details = dict(grade.details) if isinstance(grade, Grade) else {}
    return Grade(
        0.0, infra_failure=True, details={**details, "error": f"task {task_id}: grader {problem}"}
    )


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
    sandbox_kind: str | None = None
    """The name of the engine the episode's sandboxes are made by ("docker", "bwrap"; None
    when a factory decides), for a grader that needs a sandbox of another spec
    (``make_sandbox``)."""
    make_sandbox: Callable[[SandboxSpec], Sandbox] | None = None
    """Makes a new sandbox of the episode's kind from another spec (a Harbor task's separate
    verifier image), closed by the env like ``fresh_sandbox``'s; None where the caller cannot."""
    artifacts_dir: Path | None = None
    """The episode's own folder for files a task keeps of its sandbox (Harbor's ``artifacts``),
    or None: nothing is kept."""


PROTOCOL_VERSION = 2
"""Version of the ``Task`` protocol. 2: ``sandbox_spec(self, kind)`` and ``grade(self,
sandbox, context)`` take their arguments explicitly. 1: ``sandbox_spec(self)`` and ``grade(self,
sandbox)`` (optionally with a ``fresh_sandbox=`` keyword); still served through
``TaskV1Adapter``. A task may say which version it implements with a ``protocol_version``
attribute, read from the task (instance), so a dataclass field does, ``slots=True`` or not;
without one, its methods' signatures decide."""

OLDEST_PROTOCOL_VERSION = 1
"""The oldest ``Task`` protocol version still served (through an adapter)."""

_SIGNATURES = {
    2: {"sandbox_spec": "sandbox_spec(self, kind)", "grade": "grade(self, sandbox, context)"},
    1: {"sandbox_spec": "sandbox_spec(self)", "grade": "grade(self, sandbox)"},
}
_COMMON = {"setup": "setup(self, sandbox)", "reference_solution": "reference_solution(self)"}


class Task(Protocol):
    """One agentic task. Implementations don't inherit this; they match it (its fields may be
    plain attributes, dataclass fields, frozen or not, or properties: the protocol only reads
    them)."""

    @property
    def task_id(self) -> str: ...

    @property
    def instruction(self) -> str:
        """The prompt text shown to the agent."""
        ...

    @property
    def max_turns(self) -> int: ...

    @property
    def timeout_s(self) -> float:
        """Per-command timeout for the agent's tool calls."""
        ...

    def sandbox_spec(self, kind: str | None) -> SandboxSpec:
        """How to build this task's sandbox. ``kind`` is the name of the env's sandbox engine
        (``"bwrap"``, ``"docker"``, an installed package's) or None for a custom sandbox
        factory, so a task that needs what the engine cannot do (a Docker build, under
        bubblewrap) asks the engine, which refuses it in one line (``NeedsDockerError``):
        ``sandbox_engine(kind).refuse(needs, f"task {task_id}")``, ``needs`` mapping
        ``environments.sandboxes.engines`` capabilities to why."""
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

    @property
    def name(self) -> str: ...

    def __iter__(self) -> Iterator[Task]: ...

    def __len__(self) -> int: ...


class _Identified(Protocol):
    @property
    def task_id(self) -> str: ...


T = TypeVar("T", bound=_Identified)


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
            if task.task_id == task_id:
                return task
        known = [t.task_id for t in self.tasks]
        raise KeyError(f"{self.name}: no task {task_id!r}; known: {known}")


# --- protocol versions ------------------------------------------------------------------------


class TaskProtocolError(ValueError):
    """A task matches no ``Task`` protocol version this ThunderSync serves. One line: the
    task, the method, the expected signature and the protocol version."""


@dataclass(frozen=True, slots=True)
class TaskV1Adapter:
    """A task written for ``Task`` protocol 1 served as protocol 2: ``sandbox_spec(kind)``
    drops the kind, ``grade(sandbox, context)`` passes the sandbox (and
    ``fresh_sandbox=context.fresh_sandbox`` to a grader that takes it; protocol 1 had no strict
    flag, so such a task grades as it always did). Other attributes are the task's own."""

    task: Any
    fresh_keyword: bool = False

    protocol_version = 1

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def instruction(self) -> str:
        return self.task.instruction

    @property
    def max_turns(self) -> int:
        return self.task.max_turns

    @property
    def timeout_s(self) -> float:
        return self.task.timeout_s

    def sandbox_spec(self, kind: str | None) -> SandboxSpec:
        return self.task.sandbox_spec()

    def setup(self, sandbox: Sandbox) -> None:
        self.task.setup(sandbox)

    def grade(self, sandbox: Sandbox, context: GradingContext) -> Grade:
        if self.fresh_keyword:
            return self.task.grade(sandbox, fresh_sandbox=context.fresh_sandbox)
        return self.task.grade(sandbox)

    def reference_solution(self) -> list[str]:
        return self.task.reference_solution()

    def __getattr__(self, name: str) -> Any:  # a task's own fields (a toy's table, ...)
        return getattr(self.task, name)


def as_current(task: Any) -> Task:
    """``task`` as a ``Task`` of ``PROTOCOL_VERSION``: itself when it matches, wrapped in
    ``TaskV1Adapter`` when it was written for protocol 1; ``TaskProtocolError`` (one line)
    otherwise. Checked once per task class (a dictionary look-up after that)."""
    if isinstance(task, TaskV1Adapter):
        return task
    declared = getattr(task, "protocol_version", None)  # the instance's: see _protocol_of
    version, fresh_keyword = _protocol_of(type(task), declared, _described(task))
    if version == PROTOCOL_VERSION:
        return task
    return TaskV1Adapter(task, fresh_keyword)


def _described(task: Any) -> str:
    kind = type(task)
    return f"task {getattr(task, 'task_id', '?')!r} ({kind.__module__}.{kind.__qualname__})"


def _protocol_of(kind: type[Any], declared: Any, described: str) -> tuple[int, bool]:
    """The protocol of a task of class ``kind`` whose instance declares ``declared`` (None:
    nothing). ``declared`` is read from the instance, never the class: a field of a
    ``slots=True`` dataclass is a member descriptor on the class (the README's task style),
    and a dataclass instance may be made with another value than its class default. The
    signatures are the class's, so the answer is cached per (class, declared version)."""
    try:
        return _PROTOCOLS[kind, declared]
    except KeyError:
        pass
    except TypeError:  # an unhashable class or declared value: checked every time
        return _check_protocol(kind, declared, described)
    found = _PROTOCOLS[kind, declared] = _check_protocol(kind, declared, described)
    return found


_PROTOCOLS: dict[tuple[type, Any], tuple[int, bool]] = {}


def _check_protocol(kind: type[Any], declared: Any, described: str) -> tuple[int, bool]:
    """(version, whether a protocol-1 ``grade`` takes ``fresh_sandbox=``) of a task of class
    ``kind`` whose instance declares ``declared``."""
    if declared is not None and (
        isinstance(declared, bool) or not isinstance(declared, int) or declared not in _SIGNATURES
    ):
        raise TaskProtocolError(
            f"{described}: declares protocol_version {declared!r}; this ThunderSync serves "
            f"Task protocol {OLDEST_PROTOCOL_VERSION}..{PROTOCOL_VERSION}"
        )
    for name, signature in _COMMON.items():
        if not callable(getattr(kind, name, None)):
            raise TaskProtocolError(
                f"{described}: has no {signature} (Task protocol {PROTOCOL_VERSION})"
            )
    spec_args = {2: ("kind",), 1: ()}
    grade_args = {2: ("sandbox", "context"), 1: ("sandbox",)}
    candidates = [declared] if declared is not None else [2, 1]
    for method, arguments in (("sandbox_spec", spec_args), ("grade", grade_args)):
        function = getattr(kind, method, None)
        if not callable(function):
            raise TaskProtocolError(
                f"{described}: has no {_SIGNATURES[PROTOCOL_VERSION][method]} "
                f"(Task protocol {PROTOCOL_VERSION})"
            )
        fits = [v for v in candidates if _binds(function, arguments[v])]
        if not fits:
            version = candidates[0]
            if declared is not None:
                why = ""
            elif len(candidates) > 1:
                why = f" (or {_SIGNATURES[1][method]}, protocol 1, served through an adapter)"
            else:  # the earlier method chose the version
                why = " (the version its sandbox_spec follows)"
            raise TaskProtocolError(
                f"{described}: {method}{_shown(function)} does not match Task protocol "
                f"{version}: expected {_SIGNATURES[version][method]}{why}"
            )
        candidates = fits
    version = candidates[0]
    fresh = version == 1 and _binds(kind.grade, ("sandbox",), ("fresh_sandbox",))
    return version, fresh


def _binds(function: Any, args: tuple[str, ...], keywords: tuple[str, ...] = ()) -> bool:
    """Whether ``function`` (looked up on the class: ``self`` first) accepts ``args``."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return True  # a builtin or C callable: nothing to check against
    try:
        signature.bind("self", *args, **dict.fromkeys(keywords))
    except TypeError:
        return False
    return True


def _shown(function: Any) -> str:
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):
        return "(...)"


# --- task sources ---------------------------------------------------------------------------


@runtime_checkable
class TaskSource(Protocol):
    """An env's tasks, listed and drawn by split without making an env.

    ``splits`` names the splits it has (``train`` always; ``heldout`` when it declares one).
    ``draw(rng, split)`` draws one task (a finite split with replacement, as training does);
    ``tasks(split)`` lists a finite split, or returns None for a generated one.
    """

    @property
    def name(self) -> str: ...

    def splits(self) -> tuple[str, ...]: ...

    def draw(self, rng: np.random.Generator, split: str = TRAIN) -> Task: ...

    def tasks(self, split: str = TRAIN) -> Sequence[Task] | None: ...


def _check_split(source: Any, split: str) -> None:
    if split not in source.splits():
        raise ValueError(
            f"task source {source.name!r}: no split {split!r}; it has {list(source.splits())}"
        )


@dataclass(frozen=True, slots=True)
class FixedTasks:
    """A ``TaskSource`` of fixed lists: a training split and, when given, a held-out one.
    Every task is checked against the protocol when the source is made (``as_current``)."""

    name: str
    train: tuple[Any, ...]
    heldout: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "train", tuple(as_current(t) for t in self.train))
        if self.heldout is not None:
            object.__setattr__(self, "heldout", tuple(as_current(t) for t in self.heldout))
            shared = {t.task_id for t in self.train} & {t.task_id for t in self.heldout}
            if shared:
                raise ValueError(
                    f"task source {self.name!r}: tasks in both the training and "
                    f"the held-out split: {sorted(shared)}"
                )

    def splits(self) -> tuple[str, ...]:
        return SPLITS if self.heldout is not None else (TRAIN,)

    def tasks(self, split: str = TRAIN) -> Sequence[Task]:
        _check_split(self, split)
        chosen = self.train if split == TRAIN else self.heldout
        return chosen or ()

    def draw(self, rng: np.random.Generator, split: str = TRAIN) -> Task:
        tasks = self.tasks(split)
        if not tasks:
            raise ValueError(f"task source {self.name!r}: its {split} split has no tasks")
        return tasks[int(rng.integers(len(tasks)))]


@dataclass(frozen=True, slots=True)
class SuiteTasks:
    """A ``TaskSource`` over a benchmark suite (SWE-bench rows, Terminal-Bench or Harbor task
    folders): the suite is its own split, so ``train`` and ``heldout`` are both the suite's
    tasks. A benchmark is an evaluation set; to train on tasks that ``eval`` then does not
    score, train on one suite (``suite=`` rows or folders) and evaluate on another."""

    name: str
    suite: tuple[Any, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "suite", tuple(as_current(t) for t in self.suite))

    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def tasks(self, split: str = TRAIN) -> Sequence[Task]:
        _check_split(self, split)
        return self.suite

    def draw(self, rng: np.random.Generator, split: str = TRAIN) -> Task:
        _check_split(self, split)
        if not self.suite:
            raise ValueError(f"suite {self.name!r} has no tasks")
        return self.suite[int(rng.integers(len(self.suite)))]


@dataclass(frozen=True, slots=True)
class GeneratedTasks:
    """A ``TaskSource`` over a generator of tasks (``generate(rng) -> Task``), split by the
    task's content: a task is held-out iff a hash of its ``task_id`` is 0 modulo
    ``heldout_every``. Training draws skip held-out tasks and held-out draws keep only them,
    so the two splits are disjoint by construction whatever the seeds (two seed streams alone
    are independent, not disjoint: both can draw the same table), and both come from the same
    distribution. The toy envs' ids hash the whole task, so equal ids are equal tasks."""

    name: str
    generate: Callable[[np.random.Generator], Any]
    heldout_every: int = 16

    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def tasks(self, split: str = TRAIN) -> None:
        _check_split(self, split)
        return None

    def draw(self, rng: np.random.Generator, split: str = TRAIN) -> Task:
        _check_split(self, split)
        want = split == HELDOUT
        for _ in range(MAX_DRAWS):
            task = self.generate(rng)
            if self.is_heldout(task.task_id) == want:
                return as_current(task)
        raise ValueError(
            f"task source {self.name!r}: no {split} task in {MAX_DRAWS} draws "
            "(its tasks vary too little to split)"
        )

    def is_heldout(self, task_id: str) -> bool:
        return heldout_by_hash(task_id, self.heldout_every)
