"""The reference run: the task's reference solution graded strictly, once per task, as the
standard a strict pass is proven against (docs/design.md §6.1, ``witness.py``).

For each task (keyed by a hash of its folder's files, the reference solution's commands, the
sandbox kind and the witness's ``VERSION``) the reference solution runs in a fresh sandbox and
its work is graded like any agent's, watched by the witness. What that run shows — the tests
the reference solution passes, the code files its test processes load from the work folder —
is cached in memory and on disk (``$THUNDERSYNC_REFERENCE_CACHE``, default
``~/.cache/thundersync/reference-runs``), so each task costs one such run per machine, not one
per episode. A reference solution that does not score 1.0 strictly leaves the task without a
standard: strict grading cannot prove a pass there, and says so (an infrastructure failure:
the task's, not the agent's).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.proof import witness

CACHE_VARIABLE = "THUNDERSYNC_REFERENCE_CACHE"
_MAX_TASK_BYTES = 256 * 1024 * 1024
"""A task folder hashed in full up to this size (larger ones by names, sizes and times)."""


@dataclass(frozen=True, slots=True)
class ReferenceRun:
    """The reference solution's strict run of one task: the standard (``reference``), or why
    there is none (``error``)."""

    reference: witness.Reference | None
    error: str | None = None
    reward: float = 0.0

    def to_json(self) -> dict[str, Any]:
        ref = self.reference
        return {
            "tests": sorted(ref.tests) if ref else None,
            "loads": sorted(ref.loads) if ref else None,
            "replaced": sorted(ref.replaced) if ref else None,
            "solution_changed": sorted(ref.solution_changed) if ref else None,
            "defined": sorted(ref.defined) if ref else None,
            "reads": sorted(map(list, ref.reads)) if ref else None,
            "written": sorted(ref.written) if ref else None,
            "contents": sorted(map(list, ref.contents)) if ref else None,
            "error": self.error,
            "reward": self.reward,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> ReferenceRun:
        tests, loads = data.get("tests"), data.get("loads")
        reference = None
        if isinstance(tests, list) and isinstance(loads, list):
            replaced, changed = data.get("replaced"), data.get("solution_changed")
            defined, reads, written = data.get("defined"), data.get("reads"), data.get("written")
            contents = data.get("contents")
            reference = witness.Reference(
                frozenset(map(str, tests)),
                frozenset(map(str, loads)),
                frozenset(map(str, replaced)) if isinstance(replaced, list) else frozenset(),
                frozenset(map(str, changed)) if isinstance(changed, list) else frozenset(),
                frozenset(map(str, defined)) if isinstance(defined, list) else frozenset(),
                frozenset(
                    (str(pair[0]), str(pair[1]))
                    for pair in (reads if isinstance(reads, list) else [])
                    if isinstance(pair, list) and len(pair) == 2
                ),
                frozenset(map(str, written)) if isinstance(written, list) else frozenset(),
                frozenset(
                    (str(row[0]), str(row[1]), str(row[2]))
                    for row in (contents if isinstance(contents, list) else [])
                    if isinstance(row, list) and len(row) == 3
                ),
            )
        error = data.get("error")
        return ReferenceRun(reference, str(error) if error else None, float(data.get("reward", 0)))


_memory: dict[str, ReferenceRun] = {}
_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_VARIABLE)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "thundersync" / "reference-runs"


def task_key(task_dir: Path, commands: list[str], kind: str | None) -> str:
    """A hash of everything the reference run depends on: the task folder's files (names and
    contents), the reference solution's commands, the sandbox kind and the witness version."""
    digest = hashlib.sha256(f"witness {witness.VERSION}\nkind {kind}\n".encode())
    for command in commands:
        digest.update(b"command\0" + command.encode("utf-8", "surrogateescape") + b"\0")
    total = 0
    for path in sorted(p for p in task_dir.rglob("*") if p.is_file() and not p.is_symlink()):
        stat = path.stat()
        total += stat.st_size
        digest.update(str(path.relative_to(task_dir)).encode("utf-8", "surrogateescape") + b"\0")
        if total <= _MAX_TASK_BYTES:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        else:
            digest.update(f"{stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def reference_run(key: str, compute: Callable[[], ReferenceRun]) -> ReferenceRun:
    """The cached reference run of ``key``, computed (once, however many threads ask) where
    there is none. A run that failed on the sandbox (``SandboxError``) raises and is not
    cached."""
    with _guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        if key in _memory:
            return _memory[key]
        path = cache_dir() / f"{key}.json"
        found = _read(path)
        if found is None:
            found = compute()
            _write(path, found)
        _memory[key] = found
        return found


def _read(path: Path) -> ReferenceRun | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return ReferenceRun.from_json(data) if isinstance(data, dict) else None


def _write(path: Path, run: ReferenceRun) -> None:
    """Atomically (a reader never sees half a file); a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(run.to_json(), handle)
        os.replace(tmp, path)
    except OSError:
        pass


def forget() -> None:
    """Drop the in-memory cache (tests that change the disk cache's folder)."""
    with _guard:
        _memory.clear()
