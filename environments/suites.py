"""Suites: a registered name or a folder of tasks, resolved to a TaskSet (what ``eval`` runs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from environments.tasks import SuiteTasks, TaskList, TaskSet

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SWEBENCH_SUFFIXES = (".json", ".jsonl", ".parquet")
TERMINAL_BENCH_FILES = ("task.yaml", "task.toml")
"""What a Terminal-Bench 1 / Harbor task folder holds (for messages; the loader decides)."""


class UnknownSuiteError(ValueError):
    """A suite name that is not registered and not an existing path."""


def _load_swebench(path: Path) -> TaskSet:
    from environments.swebench import load_instances

    return load_instances(path)


def _load_terminal_bench(path: Path) -> TaskSet:
    from environments.terminal_bench import load_tasks

    return load_tasks(path)


def _toy_sum() -> TaskSet:
    from environments.toy import toy_sum_suite

    return toy_sum_suite()


SUITES: dict[str, Callable[[], TaskSet]] = {
    "swebench-mini": lambda: _load_swebench(FIXTURES / "swebench"),
    "tb1-mini": lambda: _load_terminal_bench(FIXTURES / "terminal_bench" / "tb1"),
    "harbor-mini": lambda: _load_terminal_bench(FIXTURES / "terminal_bench" / "harbor"),
    "toy-sum": _toy_sum,
}


def resolve_suite(name_or_path: str | Path) -> TaskSet:
    """A registered suite (``sorted(SUITES)``) or a path, by format.

    A path is a SWE-bench instance file (.json/.jsonl/.parquet) or a folder of them, or a
    Terminal-Bench / Harbor task folder (``task.yaml`` / ``task.toml``) or a folder of such
    folders. Raises UnknownSuiteError for anything else, naming it and what was expected.
    """
    if isinstance(name_or_path, str) and name_or_path in SUITES:
        return SUITES[name_or_path]()
    path = Path(name_or_path)
    if not path.exists():
        raise UnknownSuiteError(
            f"unknown suite {str(name_or_path)!r}: not a registered suite "
            f"({', '.join(sorted(SUITES))}) and no such file or folder"
        )
    kind = detect_format(path)
    if kind == "terminal_bench":
        return _load_terminal_bench(path)
    if kind == "swebench":
        return _load_swebench(path)
    raise UnknownSuiteError(
        f"{path}: unrecognised suite folder: expected SWE-bench instance files "
        f"({', '.join(SWEBENCH_SUFFIXES)}) or Terminal-Bench/Harbor task folders "
        f"(holding {' or '.join(TERMINAL_BENCH_FILES)})"
    )


def detect_format(path: Path) -> str | None:
    """``"terminal_bench"``, ``"swebench"`` or None for a file or folder. Task folders are
    recognised by the Terminal-Bench loader's own rule; SWE-bench data by its file suffix
    (a malformed instance file then gets the loader's error naming the row and field)."""
    from environments.terminal_bench.loader import looks_like_terminal_bench

    if path.is_file():
        return "swebench" if path.suffix in SWEBENCH_SUFFIXES else None
    if looks_like_terminal_bench(path):
        return "terminal_bench"
    if any(child.suffix in SWEBENCH_SUFFIXES for child in path.iterdir() if child.is_file()):
        return "swebench"
    return None


def resolve_suites(names: str | Path | Sequence[str | Path]) -> TaskSet:
    """One suite, or several concatenated in order."""
    if isinstance(names, str | Path):
        return resolve_suite(names)
    sets = [resolve_suite(name) for name in names]
    tasks = tuple(task for task_set in sets for task in task_set)
    seen: set[str] = set()
    for task in tasks:
        if task.task_id in seen:
            raise ValueError(f"suites {list(names)}: task id {task.task_id!r} appears twice")
        seen.add(task.task_id)
    return TaskList("+".join(task_set.name for task_set in sets), tasks)


def make_suite_env(suite: str | Sequence[str] = "swebench-mini", **kwargs: Any) -> Any:
    """A ShellEnv over every task of ``suite`` (the entry point of the benchmark envs).

    ``kwargs`` go to ``ShellEnv`` (``sandbox``, ``max_turns``, ``max_episode_s``, ...).
    """
    from environments.core import ShellEnv

    return ShellEnv(suite_task_source(suite), **kwargs)


def suite_task_source(suite: str | Sequence[str] = "swebench-mini", **_: Any) -> SuiteTasks:
    """The tasks of ``make_suite_env(suite, ...)`` without making the env: the suite is its
    own split (``SuiteTasks``); the env's other keywords are ignored."""
    tasks = resolve_suites(suite)
    return SuiteTasks(tasks.name, tuple(tasks))


# An entry point's task_source attribute (registry.task_source reads it): a function attribute.
make_suite_env.task_source = suite_task_source  # type: ignore[attr-defined]
