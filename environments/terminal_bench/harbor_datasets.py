"""Harbor datasets on disk (harbor 0.26's ``download``, ``registry`` and ``tasks`` code): a
folder with a ``dataset.toml`` manifest, or Harbor's package cache, as a named task set.

Three layouts reach a disk (docs/harbor-0.26-notes.md §5):

- ``harbor download org/name@version`` (export mode, its default) writes
  ``<out>/<name>/<task>/``: a folder of task folders, which ``loader.load_tasks`` reads as any.
- ``--cache`` (and ``harbor run``) fill the package cache,
  ``~/.cache/harbor/tasks/packages/<org>/<task>/<sha256 hex>/``: a task folder named by its
  content hash. ``load_cache`` reads that folder, one org's folder in it or one task's, and
  names each task by its package name; a task cached in two versions is refused (a
  ``dataset.toml`` pins one).
- A dataset's own folder (``harbor init --dataset``, what ``harbor publish`` reads) holds
  ``dataset.toml``: ``[dataset] name``, and ``[[tasks]]`` of ``name = "org/task"`` and
  ``digest = "sha256:<hex>"``. ``load_manifest`` lists those tasks in order, each found as a
  child folder whose ``[task] name`` is the task's, else in the cache layout under the
  folder at its digest. A folder found by name is not hashed again (Harbor's ``sync`` would
  update the digest); a cache folder is its digest.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from environments.tasks import TaskFormatError, TaskList
from environments.terminal_bench import inputs, schema
from environments.terminal_bench.task import TerminalBenchTask
from thundersync.protocol.documents import DocumentError, excerpt, load_toml

MANIFEST = "dataset.toml"
_HASH = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*")
Loader = Callable[[Path], TerminalBenchTask]


def _toml(path: Path) -> dict[str, Any]:
    try:
        return load_toml(schema.read_utf8(path, "<document>"), path)
    except DocumentError as err:
        raise TaskFormatError(path, "<document>", err.problem) from None


def _named(root: Path, folder: Path, name: str, load: Loader) -> TerminalBenchTask:
    """The task in ``folder`` (links followed, staying inside ``root``) under its package name
    (a cache folder's own name is its hash)."""
    task = load(inputs.inside(folder, root, str(folder.relative_to(root))))
    return dataclasses.replace(task, task_id=schema.check_task_id(Path(name)))


def _is_cached_task(folder: Path) -> bool:
    return bool(_HASH.fullmatch(folder.name)) and (folder / "task.toml").is_file()


def _versions(task_folder: Path) -> list[Path]:
    return sorted(c for c in task_folder.iterdir() if c.is_dir() and _is_cached_task(c))


def cache_depth(folder: Path) -> int | None:
    """How far above a cached task folder ``folder`` is: 1 one task's (``<org>/<task>``),
    2 an org's, 3 the packages folder; None when it is no package cache."""
    level: list[Path] = [folder]
    for depth in (1, 2, 3):
        if any(_versions(p) for p in level):
            return depth
        level = [c for p in level for c in sorted(p.iterdir()) if c.is_dir()][:10_000]
        if not level:
            return None
    return None


def is_cache(folder: Path) -> bool:
    """Whether ``folder`` is Harbor's package cache (or an org's or a task's folder in it),
    rather than a folder of task folders that happen to hold one."""
    if cache_depth(folder) is None:
        return False
    return not any(
        (child / "task.toml").is_file() and not _HASH.fullmatch(child.name)
        for child in folder.iterdir()
        if child.is_dir()
    )


def load_cache(root: Path, load: Loader) -> TaskList[TerminalBenchTask]:
    """Every task of a Harbor package cache folder, by package name, sorted."""
    depth = cache_depth(root)
    if depth is None:
        raise TaskFormatError(root, "path", "expected Harbor's <org>/<task>/<sha256>/ folders")
    tasks: list[Path] = [root]
    for _ in range(depth - 1):
        tasks = [c for p in tasks for c in sorted(p.iterdir()) if c.is_dir()]
    found: dict[str, Path] = {}
    for task_folder in tasks:
        versions = _versions(task_folder)
        if len(versions) > 1:
            hashes = ", ".join(v.name[:12] for v in versions)
            raise TaskFormatError(
                task_folder,
                "path",
                f"task {task_folder.name!r} is cached in {len(versions)} versions ({hashes}…): "
                f"pin one with a {MANIFEST} ([[tasks]] name and digest) beside the cache",
            )
        if versions and task_folder.name in found:
            raise TaskFormatError(
                task_folder, "path", f"two tasks named {task_folder.name!r} (in two orgs)"
            )
        if versions:
            found[task_folder.name] = versions[0]
    loaded = tuple(_named(root, found[name], name, load) for name in sorted(found))
    return TaskList(name=root.name, tasks=loaded)


def _task_refs(path: Path, data: dict[str, Any]) -> list[tuple[str, str]]:
    entries = data.get("tasks", [])
    if not isinstance(entries, list) or not entries:
        raise TaskFormatError(path, "tasks", f"expected [[tasks]] tables, got {excerpt(entries)}")
    refs = []
    for i, entry in enumerate(entries):
        table = schema.check_mapping(path, f"tasks[{i}]", entry)
        name, digest = table.get("name"), table.get("digest")
        if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
            raise TaskFormatError(
                path, f"tasks[{i}].name", f"expected 'org/name', got {excerpt(name)}"
            )
        match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
        if match is None:
            raise TaskFormatError(
                path, f"tasks[{i}].digest", f"expected 'sha256:<64 hex>', got {excerpt(digest)}"
            )
        refs.append((name, match.group(1)))
    return refs


def _by_package_name(root: Path) -> dict[str, Path]:
    """The child task folders by their ``[task] name`` (Harbor's ``sync`` index)."""
    found: dict[str, Path] = {}
    for child in sorted(root.iterdir()):
        toml = child / "task.toml"
        if child.is_dir() and not child.name.startswith((".", "_")) and toml.is_file():
            table = _toml(toml).get("task")
            if isinstance(table, dict) and isinstance(table.get("name"), str):
                found.setdefault(table["name"], child)
    return found


def load_manifest(root: Path, load: Loader) -> TaskList[TerminalBenchTask]:
    """The tasks a folder's ``dataset.toml`` lists, in its order, by their short names."""
    path = root / MANIFEST
    data = _toml(path)
    dataset = schema.check_mapping(path, "dataset", data.get("dataset", {}))
    name = dataset.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TaskFormatError(path, "dataset.name", f"expected 'org/name', got {excerpt(name)}")
    local = _by_package_name(root)
    tasks, seen = [], set()
    for i, (task_name, digest) in enumerate(_task_refs(path, data)):
        org, short = task_name.split("/")
        folder = local.get(task_name) or root / org / short / digest
        if not (folder / "task.toml").is_file():
            raise TaskFormatError(
                path,
                f"tasks[{i}]",
                f"task {task_name!r} not found: no folder here whose [task] name is it, "
                f"and no {org}/{short}/{digest[:12]}…/ (harbor download {task_name} --cache)",
            )
        if short in seen:
            raise TaskFormatError(path, f"tasks[{i}].name", f"{short!r} is listed twice")
        seen.add(short)
        tasks.append(_named(root, folder, short, load))
    version = dataset.get("version")
    label = f"{name}@{version}" if isinstance(version, str) and version else name
    return TaskList(name=label, tasks=tuple(tasks))
