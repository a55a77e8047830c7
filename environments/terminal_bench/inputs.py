"""Task inputs are untrusted: every file a task loads or ships must resolve inside its folder.

A task folder comes from outside (a downloaded benchmark, a pull request). A link such as
``instruction.md -> /proc/self/environ`` would put the host's environment into the agent's
prompt; ``tests -> /root`` would upload host files into the sandbox; a fifo would hang a read.
So before a loader reads anything, ``check_task_folder`` walks the whole folder: every entry,
after following links, must lie inside it and be a regular file or a folder. Files are read
with a size bound, and the files shipped into a sandbox are listed again (``list_files``) when
they are used, so a folder changed after loading is caught too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from environments.tasks import TaskFormatError

MAX_TASK_FILE_BYTES = 1024 * 1024
"""task.toml, task.yaml, solution.yaml, docker-compose.yaml and Dockerfiles: at most 1 MiB."""
MAX_INSTRUCTION_BYTES = 64 * 1024
"""An instruction (instruction.md or task.yaml's ``instruction``) is at most 64 KiB of UTF-8,
about 16k tokens: a prompt, not a data dump. A longer one is refused rather than cut, since a cut
instruction silently changes the task."""

_KINDS = {
    stat.S_IFIFO: "a fifo",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.name


def check_link(path: Path, real_root: str, field: str, *, folder: str = "task folder") -> None:
    """A link must resolve inside ``real_root`` (a real path) to something that exists;
    TaskFormatError naming the link otherwise. ``folder`` says what ``real_root`` is."""
    target = os.path.realpath(path)
    if target != real_root and not target.startswith(real_root + os.sep):
        raise TaskFormatError(
            path,
            field,
            f"a link to {os.readlink(path)!r} (resolving to {target}), outside the {folder} "
            f"{real_root}: every task input must lie inside its {folder}",
        )
    if not os.path.exists(path):
        raise TaskFormatError(path, field, f"a link to {os.readlink(path)!r}, which is missing")


def _check_entry(path: Path, root: Path, real_root: str) -> None:
    """One entry of the folder: a link must resolve inside ``real_root`` to something real;
    anything that is not a regular file, folder or link is refused."""
    field = _relative(path, root)
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        check_link(path, real_root, field)
        return
    kind = _KINDS.get(stat.S_IFMT(mode))
    if kind is not None:
        raise TaskFormatError(path, field, f"expected a regular file or folder, got {kind}")


def check_task_folder(task_dir: Path) -> Path:
    """Walk ``task_dir``; raise TaskFormatError naming the first entry that leads outside it (a
    link, followed) or is not a file or folder. Returns the folder's real path."""
    real_root = os.path.realpath(task_dir)
    for dirpath, dirnames, filenames in os.walk(real_root, followlinks=False):
        for name in sorted([*dirnames, *filenames]):
            entry = Path(dirpath, name)
            _check_entry(Path(task_dir, entry.relative_to(real_root)), task_dir, real_root)
    return Path(real_root)


def inside(path: Path, task_dir: Path, field: str) -> Path:
    """``path`` with its links followed; TaskFormatError when that leaves ``task_dir``."""
    real, root = os.path.realpath(path), os.path.realpath(task_dir)
    if real != root and not real.startswith(root + os.sep):
        raise TaskFormatError(path, field, f"resolves to {real}, outside the task folder {root}")
    return Path(real)


def read_text(
    path: Path, field: str, *, limit: int = MAX_TASK_FILE_BYTES, errors: str = "strict"
) -> str:
    """A task file's UTF-8 text; at most ``limit`` bytes (TaskFormatError stating the limit).
    ``errors="replace"`` replaces undecodable bytes instead of raising."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
        if len(data) > limit:
            size = os.fstat(handle.fileno()).st_size
            raise TaskFormatError(
                path,
                field,
                f"expected at most {limit} bytes ({limit // 1024} KiB), got {size} bytes",
            )
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as err:
        raise TaskFormatError(path, field, f"expected UTF-8 text: {err}") from err


def list_files(folder: Path, task_dir: Path) -> list[tuple[Path, str]]:
    """Every regular file under ``folder`` as (real host path, path relative to ``folder``),
    links followed and checked again to stay inside ``task_dir``; sorted by relative path.
    Links are shipped as the files they point to, since their targets are host paths."""
    root = inside(folder, task_dir, _relative(folder, task_dir))
    check_task_folder(task_dir)
    files: list[tuple[Path, str]] = []
    seen: set[str] = set()

    def walk(real: Path, prefix: str) -> None:
        if str(real) in seen:
            raise TaskFormatError(folder, _relative(folder, task_dir), f"a link loop at {prefix}")
        seen.add(str(real))
        for child in sorted(real.iterdir()):
            rel = f"{prefix}{child.name}"
            target = inside(child, task_dir, f"{_relative(folder, task_dir)}/{rel}")
            if target.is_dir():
                walk(target, rel + "/")
            elif target.is_file():
                files.append((target, rel))
        seen.discard(str(real))

    walk(root, "")
    return files
