"""Finds Terminal-Bench 1 and Harbor tasks in a folder and loads them into a task set."""

from __future__ import annotations

import os
from pathlib import Path

from environments.tasks import TaskFormatError, TaskList
from environments.terminal_bench import harbor_datasets, inputs
from environments.terminal_bench.harbor import load_harbor_task
from environments.terminal_bench.task import TerminalBenchTask
from environments.terminal_bench.tb1 import load_tb1_task

TASK_FILES = ("task.yaml", "task.toml")


def _is_task_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in TASK_FILES)


def looks_like_terminal_bench(path: str | Path) -> bool:
    """True if ``path`` is a task folder, holds task folders (task.yaml or task.toml), or is a
    Harbor dataset (a ``dataset.toml``, or Harbor's package cache: ``harbor_datasets``)."""
    folder = Path(path)
    if not folder.is_dir():
        return False
    return (
        _is_task_dir(folder)
        or (folder / harbor_datasets.MANIFEST).is_file()
        or any(child.is_dir() and _is_task_dir(child) for child in folder.iterdir())
        or harbor_datasets.is_cache(folder)
    )


def load_task(task_dir: Path, *, max_turns: int = 50) -> TerminalBenchTask:
    """Load one task folder, detecting its format by its task file."""
    has_yaml, has_toml = ((task_dir / name).is_file() for name in TASK_FILES)
    if has_yaml and has_toml:
        raise TaskFormatError(
            task_dir, "task.yaml", "expected one task file, found both task.yaml and task.toml"
        )
    if has_yaml:
        return load_tb1_task(task_dir, max_turns=max_turns)
    if has_toml:
        return load_harbor_task(task_dir, max_turns=max_turns)
    raise TaskFormatError(
        task_dir,
        "task.yaml",
        "expected task.yaml (Terminal-Bench 1) or task.toml (Harbor), found neither",
    )


def load_tasks(path: str | Path, *, max_turns: int = 50) -> TaskList:
    """Load a task folder or a folder of task folders; every malformed task raises
    TaskFormatError. Sub-folders whose names start with '.' or '_' are skipped; a sub-folder
    that is a link must stay inside the suite folder (a link out of it is an error naming it,
    as links out of a task folder are). A Harbor dataset (a folder with ``dataset.toml``, or
    Harbor's package cache) lists its tasks by package name (``harbor_datasets``)."""
    root = Path(path)
    if not root.is_dir():
        raise TaskFormatError(root, "path", "expected a task folder or a folder of task folders")
    if _is_task_dir(root):
        return TaskList(name=root.name, tasks=(load_task(root, max_turns=max_turns),))
    if (root / harbor_datasets.MANIFEST).is_file():
        return harbor_datasets.load_manifest(root, lambda d: load_task(d, max_turns=max_turns))
    if harbor_datasets.is_cache(root):
        return harbor_datasets.load_cache(root, lambda d: load_task(d, max_turns=max_turns))
    real_root = os.path.realpath(root)
    children = sorted(
        child
        for child in root.iterdir()
        if child.is_dir() and not child.name.startswith((".", "_"))
    )
    for child in children:
        if child.is_symlink():
            inputs.check_link(child, real_root, child.name, folder="suite folder")
    tasks = tuple(load_task(child, max_turns=max_turns) for child in children)
    if not tasks:
        raise TaskFormatError(root, "task.yaml", "expected task folders, found none")
    return TaskList(name=root.name, tasks=tasks)
