"""Terminal-Bench 1 (task.yaml) and Harbor (task.toml) tasks: loading, sandboxes and grading."""

from __future__ import annotations

from environments.terminal_bench.loader import (
    load_task,
    load_tasks,
    looks_like_terminal_bench,
)
from environments.terminal_bench.task import TerminalBenchTask

__all__ = [
    "TerminalBenchTask",
    "load_task",
    "load_tasks",
    "looks_like_terminal_bench",
]
