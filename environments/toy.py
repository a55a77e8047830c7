"""Toy envs for CPU RL training: table look-ups with real tools run in the sandbox.

``thundersync/ToySum-v0``: the prompt names two keys of a table that is redrawn every
episode and stored as ``table.txt`` in the sandbox; the agent must ``lookup`` both, ``calc``
their sum and ``answer`` it (3 tool calls, then the answer submits). ``thundersync/
ToyChain-v0``: the prompt names a start key; each ``lookup`` returns the next key or, at the
end of a chain of 1..``max_hops`` hops, a number, which the agent must ``answer``. Episodes
therefore vary in length.

Every action is one ```bash block holding one of four commands (a small, regular
vocabulary for a word-level tokenizer): ``lookup KEY``, ``calc A+B``, ``answer N`` and
``submit``. Reward is 1.0 iff the answered number is right. Tasks are drawn with the env's
``np_random``, so episodes are deterministic given the seed, and each task's
``reference_solution()`` is the oracle's play. Both envs have a held-out split
(``GeneratedTasks``): a sixteenth of all tables, chosen by a hash of the task, that training
never draws and ``eval --env`` evaluates on. A latency knob adds a fixed (``sigma=0``) or
log-normal delay (median ``*_latency_s``) to every tool call and every grading, drawn from a
generator seeded at reset, to build long-tail workloads.

``tools="python"`` runs the three tools in-process instead of as scripts in a sandbox: an
interpreter of exactly ``lookup``, ``calc``, ``answer`` (and the grader's ``cat answer.txt``),
with the scripts' outputs and exit codes, and ``command not found`` (127) for anything else;
no shell and no process is ever started. Workloads that measure a training pipeline use it
with the latency knob, so what they time is rollout, tools' latency and learning, not
sandbox start-up costs.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from environments.core import INSTANT_STEPS, SandboxFactory, ShellEnv
from environments.sandboxes.protocol import ExecResult, Sandbox, SandboxError, SandboxSpec
from environments.tasks import GeneratedTasks, Grade, GradingContext, TaskList

KEYS = (
    "red",
    "blue",
    "green",
    "gold",
    "pink",
    "gray",
    "cyan",
    "lime",
    "navy",
    "plum",
    "rose",
    "teal",
)
TOOL_TIMEOUT_S = 10.0

_SCRIPTS = {
    "lookup": """#!/bin/sh
case "$1" in ''|*[!a-z0-9]*) echo "unknown key $1"; exit 1;; esac
v=$(grep -m1 "^$1=" "$(dirname "$0")/../table.txt" | cut -d= -f2)
if [ -z "$v" ]; then echo "unknown key $1"; exit 1; fi
echo "$v"
""",
    "calc": """#!/bin/sh
case "$1" in ''|*[!0-9+*-]*) echo "bad expression $1"; exit 1;; esac
echo $(( $1 ))
""",
    "answer": """#!/bin/sh
echo "$1" > "$(dirname "$0")/../answer.txt"
echo THUNDERSYNC_SUBMIT
""",
}


MAX_VALUE = 10**6
"""Largest table value (sums stay small integers the model's tokenizer spells)."""
MAX_LATENCY_S = 60.0
"""Cap on one injected delay, and the largest median a knob takes."""
MAX_SIGMA = 5.0
"""Log-normal spread beyond which one tail draw is the whole run (e^(5*3) ~ 3e6 x the median)."""


def _check_real(name: str, value: object, low: float, high: float) -> float:
    """``value`` as a float in [low, high], or a ValueError naming it (NaN and booleans too)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: expected a number in [{low:g}, {high:g}], got {value!r}")
    if not low <= value <= high:  # False for NaN
        raise ValueError(f"{name}: expected a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}: expected an integer in [{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """A per-call delay: ``median_s`` exactly when ``sigma`` is 0, else log-normal."""

    median_s: float = 0.0
    """Median delay in seconds (0 disables the delay)."""
    sigma: float = 0.0
    """Standard deviation of the log of the delay (0: fixed delay)."""
    max_s: float = MAX_LATENCY_S
    """Cap on one delay, so a long tail stays bounded."""

    def __post_init__(self) -> None:
        _check_real("median", self.median_s, 0.0, self.max_s)
        _check_real("sigma", self.sigma, 0.0, MAX_SIGMA)

    def draw(self, rng: np.random.Generator) -> float:
        if self.median_s <= 0:
            return 0.0
        if self.sigma <= 0:
            return min(self.median_s, self.max_s)
        return float(min(self.median_s * np.exp(self.sigma * rng.standard_normal()), self.max_s))


@dataclass(frozen=True, slots=True)
class ToyTask:
    """One table look-up task (matches the ``Task`` protocol)."""

    task_id: str
    instruction: str
    table: tuple[tuple[str, str], ...]
    solution: tuple[str, ...]
    answer: str
    max_turns: int = 8
    timeout_s: float = TOOL_TIMEOUT_S
    grade_delay_s: float = 0.0

    def sandbox_spec(self, kind: str | None = None) -> SandboxSpec:
        workdir = SandboxSpec().workdir
        return SandboxSpec(
            workdir=workdir,
            memory_mb=256,
            pids=64,
            disk_mb=32,  # a tmpfs: cheap to make, and a toy's workspace holds a few small files
            env={"PATH": f"{workdir}/bin:/usr/local/bin:/usr/bin:/bin"},
        )

    def setup(self, sandbox: Sandbox) -> None:
        parts = ["mkdir -p bin"]
        for name, body in _SCRIPTS.items():
            parts.append(f"cat > bin/{name} <<'TS_EOF'\n{body}TS_EOF\nchmod +x bin/{name}")
        rows = "".join(f"{key}={value}\n" for key, value in self.table)
        parts.append(f"cat > table.txt <<'TS_EOF'\n{rows}TS_EOF")
        result = sandbox.execute("set -e\n" + "\n".join(parts), TOOL_TIMEOUT_S)
        if result.exit_code != 0:
            raise SandboxError(f"toy task {self.task_id}: setup failed: {result.output!r}")

    def grade(self, sandbox: Sandbox, context: GradingContext | None = None) -> Grade:
        if self.grade_delay_s > 0:
            time.sleep(self.grade_delay_s)
        result = sandbox.execute("cat answer.txt", TOOL_TIMEOUT_S)
        given = result.output.strip() if result.exit_code == 0 else None
        reward = 1.0 if given == self.answer else 0.0
        return Grade(reward, details={"answer": given, "expected": self.answer})

    def reference_solution(self) -> list[str]:
        return list(self.solution)


def draw_sum_task(rng: np.random.Generator, *, num_keys: int = 6, max_value: int = 9) -> ToyTask:
    """A fresh ToySum task: a table of ``num_keys`` keys with values 0..``max_value``."""
    keys = [str(k) for k in rng.choice(KEYS, size=num_keys, replace=False)]
    values = [int(v) for v in rng.integers(0, max_value + 1, size=num_keys)]
    i, j = (int(x) for x in rng.choice(num_keys, size=2, replace=False))
    total = values[i] + values[j]
    table = tuple(zip(keys, (str(v) for v in values), strict=True))
    instruction = (
        f"Add the values of {keys[i]} and {keys[j]}. Tools: lookup KEY, calc A+B, answer N."
    )
    solution = (
        f"lookup {keys[i]}",
        f"lookup {keys[j]}",
        f"calc {values[i]}+{values[j]}",
        f"answer {total}",
    )
    return ToyTask(
        _task_id("toy-sum", table, instruction), instruction, table, solution, str(total)
    )


def draw_chain_task(rng: np.random.Generator, *, max_hops: int = 3, max_value: int = 9) -> ToyTask:
    """A fresh ToyChain task: follow 1..``max_hops`` keys to a number."""
    hops = int(rng.integers(1, max_hops + 1))
    keys = [str(k) for k in rng.choice(KEYS, size=len(KEYS), replace=False)]
    chain, decoys = keys[:hops], keys[hops:]
    value = str(int(rng.integers(0, max_value + 1)))
    rows = [(chain[n], chain[n + 1] if n + 1 < hops else value) for n in range(hops)]
    rows += [(key, str(int(rng.integers(0, max_value + 1)))) for key in decoys[:3]]
    order = rng.permutation(len(rows))
    table = tuple(rows[int(n)] for n in order)
    instruction = (
        f"Start at {chain[0]}. Each lookup gives the next key or a number. "
        "Tools: lookup KEY, answer N."
    )
    solution = tuple(f"lookup {key}" for key in chain) + (f"answer {value}",)
    return ToyTask(
        _task_id("toy-chain", table, instruction),
        instruction,
        table,
        solution,
        value,
        max_turns=max_hops + 4,
    )


def _task_id(prefix: str, table: tuple[tuple[str, str], ...], instruction: str) -> str:
    digest = hashlib.sha256(repr((table, instruction)).encode()).hexdigest()[:10]
    return f"{prefix}-{digest}"


def toy_sum_suite(num_tasks: int = 8, seed: int = 0) -> TaskList:
    """The ``toy-sum`` evaluation suite: ``num_tasks`` ToySum tasks drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return TaskList("toy-sum", tuple(draw_sum_task(rng) for _ in range(num_tasks)))


_ENV_PARAMETERS = frozenset(
    {
        "sandbox",
        "tool_latency_s",
        "tool_latency_sigma",
        "grade_latency_s",
        "grade_latency_sigma",
        "max_episode_s",
        "max_format_errors",
        "strict_grading",
        "tools",
        "disable_env_checker",
    }
)


class _ToyEnv(ShellEnv):
    """A ShellEnv whose tasks are drawn fresh every episode, with the latency knob."""

    env_name = "toy"

    @classmethod
    def task_source(cls, **kwargs: Any) -> GeneratedTasks:
        """The env's tasks for its task keywords (the others ignored): a ``GeneratedTasks``
        whose held-out split training never draws. ValueError for a keyword out of range."""
        task_kwargs = {k: v for k, v in kwargs.items() if k not in _ENV_PARAMETERS}
        cls.check_task_kwargs(task_kwargs)
        return _toy_source(cls, tuple(sorted(task_kwargs.items())))

    @staticmethod
    def generate(rng: np.random.Generator, **task_kwargs: Any) -> ToyTask:
        raise NotImplementedError

    def __init__(
        self,
        *,
        sandbox: str | SandboxFactory = "bwrap",
        tool_latency_s: float = 0.0,
        tool_latency_sigma: float = 0.0,
        grade_latency_s: float = 0.0,
        grade_latency_sigma: float = 0.0,
        max_episode_s: float | None = None,
        max_format_errors: int = 3,
        strict_grading: bool = True,
        tools: str = "sandbox",
        **task_kwargs: Any,
    ) -> None:
        if tools not in ("sandbox", "python"):
            raise ValueError(f"tools: expected 'sandbox' or 'python', got {tools!r}")
        for name, value in (("tool_latency", tool_latency_s), ("grade_latency", grade_latency_s)):
            _check_real(f"{name}_s", value, 0.0, MAX_LATENCY_S)
        for name, value in (("tool", tool_latency_sigma), ("grade", grade_latency_sigma)):
            _check_real(f"{name}_latency_sigma", value, 0.0, MAX_SIGMA)
        if max_episode_s is not None:
            _check_real("max_episode_s", max_episode_s, 1e-3, 7 * 24 * 3600.0)
        _check_int("max_format_errors", max_format_errors, 0, 1000)
        source = self.task_source(**task_kwargs)
        super().__init__(
            source,
            sandbox=(lambda spec: InProcessTools(self)) if tools == "python" else sandbox,
            max_episode_s=max_episode_s,
            max_format_errors=max_format_errors,
            strict_grading=strict_grading,
        )
        self.tool_latency = LatencyModel(tool_latency_s, tool_latency_sigma)
        self.grade_latency = LatencyModel(grade_latency_s, grade_latency_sigma)
        instant = tools == "python" and tool_latency_s <= 0 and grade_latency_s <= 0
        self.metadata = {**self.metadata, INSTANT_STEPS: instant}
        self.task_kwargs = task_kwargs
        self._latency_seed = 0
        self._latency_rng: np.random.Generator | None = None

    task_kwarg_ranges: dict[str, tuple[int, int]] = {}
    """Each task keyword's integer range (inclusive), declared by the subclass."""

    @classmethod
    def check_task_kwargs(cls, kwargs: dict[str, Any]) -> None:
        """ValueError naming a task keyword unknown or out of range (before any draw)."""
        _check_names(kwargs, tuple(cls.task_kwarg_ranges))
        for name, (low, high) in cls.task_kwarg_ranges.items():
            if name in kwargs:
                _check_int(name, kwargs[name], low, high)

    def _select_task(self, choice: Any) -> Any:
        task = self.draw_task(self.np_random) if choice is None else choice
        self._latency_seed = int(self.np_random.integers(2**63))
        self._latency_rng = None
        if not isinstance(task, ToyTask):
            return super()._select_task(task)
        delay = self._delay(self.grade_latency)
        return task if delay == task.grade_delay_s else replace(task, grade_delay_s=delay)

    def _delay(self, latency: LatencyModel) -> float:
        """A draw of ``latency`` from the episode's latency generator, which is made only once
        a delay needs it (making one costs more than an instant episode's step)."""
        if latency.median_s <= 0:
            return 0.0
        if self._latency_rng is None:
            self._latency_rng = np.random.default_rng(self._latency_seed)
        return latency.draw(self._latency_rng)

    def _execute(self, command: str, timeout: float) -> ExecResult:
        delay = self._delay(self.tool_latency)
        if delay > 0:
            time.sleep(delay)
        result = super()._execute(command, timeout)
        return replace(result, duration_s=result.duration_s + delay) if delay > 0 else result


def _check_names(kwargs: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(f"unknown keyword(s) {unknown}; task keywords: {list(known)}")


_SOURCES: dict[tuple[type[_ToyEnv], tuple[tuple[str, Any], ...]], GeneratedTasks] = {}


def _toy_source(cls: type[_ToyEnv], task_kwargs: tuple[tuple[str, Any], ...]) -> GeneratedTasks:
    """One source per env class and task keywords (an env is made per episode)."""
    source = _SOURCES.get((cls, task_kwargs))
    if source is None:
        made = GeneratedTasks(cls.env_name, functools.partial(cls.generate, **dict(task_kwargs)))
        source = _SOURCES.setdefault((cls, task_kwargs), made)
    return source


class InProcessTools:
    """The toy's tools as an in-process workspace (a ``Sandbox`` that runs no process):
    ``lookup KEY``, ``calc EXPR`` and ``answer N`` behave as the sandbox scripts do, the
    grader's ``cat answer.txt`` reads the answer, setup succeeds, anything else is ``command
    not found``. Only the command's first word and first argument count, as ``$1`` does."""

    workdir = SandboxSpec().workdir

    def __init__(self, env: _ToyEnv) -> None:
        self.env = env
        self.answer: str | None = None

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        words = cmd.split()
        if cmd.startswith("set -e\nmkdir -p bin"):  # the task's setup script
            return ExecResult("", 0, False, 0.0)
        if not words:
            return ExecResult("", 0, False, 0.0)
        name, arg = words[0], (words[1] if len(words) > 1 else "")
        if name == "cat" and arg == "answer.txt":
            if self.answer is None:
                return ExecResult("cat: answer.txt: No such file or directory\n", 1, False, 0.0)
            return ExecResult(f"{self.answer}\n", 0, False, 0.0)
        if name == "lookup":
            task = self.env.task
            if not isinstance(task, ToyTask):
                raise TypeError(f"in-process tools serve a toy task, not {type(task).__name__}")
            value = dict(task.table).get(arg) if re.fullmatch(r"[a-z0-9]+", arg) else None
            if value is None:
                return ExecResult(f"unknown key {arg}\n", 1, False, 0.0)
            return ExecResult(f"{value}\n", 0, False, 0.0)
        if name == "calc":
            total = _arithmetic(arg) if re.fullmatch(r"[0-9+*-]+", arg) else None
            if total is None:
                return ExecResult(f"bad expression {arg}\n", 1, False, 0.0)
            return ExecResult(f"{total}\n", 0, False, 0.0)
        if name == "answer":
            self.answer = arg
            return ExecResult("THUNDERSYNC_SUBMIT\n", 0, False, 0.0)
        return ExecResult(f"bash: line 1: {name}: command not found\n", 127, False, 0.0)

    def upload(self, src: Any, dst: str) -> None:
        raise SandboxError("in-process toy tools hold no files")

    def download(self, src: str, dst: Any) -> None:
        raise SandboxError("in-process toy tools hold no files")

    def export_folder(self, path: str, dst: Any, *, exclude: Any = ()) -> None:
        raise SandboxError("in-process toy tools hold no files")

    def stop_processes(self) -> None:
        """Nothing to stop: the tools run no process."""

    def close(self) -> None:
        self.answer = None


def _arithmetic(expression: str) -> int | None:
    """+, - and * of integers (what the calc script's ``$(( ))`` computes for its inputs),
    or None for anything else (``**``, a huge number, bad syntax)."""
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and node.value < 2**31:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
            a, b = value(node.left), value(node.right)
            result = (
                a + b
                if isinstance(node.op, ast.Add)
                else a - b
                if isinstance(node.op, ast.Sub)
                else a * b
            )
            if abs(result) >= 2**63:
                raise ValueError("overflow")
            return result
        raise ValueError("not plain arithmetic")

    try:
        return value(tree)
    except ValueError:
        return None


class ToySumEnv(_ToyEnv):
    """``thundersync/ToySum-v0``: look up two keys, add them, answer (see module docstring).

    Keyword arguments: ``num_keys`` (table size, default 6), ``max_value`` (default 9), the
    latency knob, ``sandbox`` and ``tools`` (``"sandbox"`` or ``"python"``).
    """

    env_name = "ToySum"

    task_kwarg_ranges = {"num_keys": (2, len(KEYS)), "max_value": (0, MAX_VALUE)}

    @staticmethod
    def generate(rng: np.random.Generator, **task_kwargs: Any) -> ToyTask:
        return draw_sum_task(rng, **task_kwargs)


class ToyChainEnv(_ToyEnv):
    """``thundersync/ToyChain-v0``: follow a chain of keys to a number (see module docstring).

    Keyword arguments: ``max_hops`` (default 3), ``max_value`` (default 9), the latency knob,
    ``sandbox`` and ``tools``.
    """

    env_name = "ToyChain"

    task_kwarg_ranges = {"max_hops": (1, len(KEYS)), "max_value": (0, MAX_VALUE)}

    @staticmethod
    def generate(rng: np.random.Generator, **task_kwargs: Any) -> ToyTask:
        return draw_chain_task(rng, **task_kwargs)
