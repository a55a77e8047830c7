"""Host-side access to a sandbox workspace: path mapping, safe copies in and out, process sweep.

The sandboxed command can plant symlinks in its workspace (``ln -s /etc x``); every host-side
copy therefore refuses a path whose real location leaves the workspace, replaces a symlink it
is about to write over instead of following it, copies links inside downloaded folders as
links (never their targets), and skips fifos, sockets and devices (reading a fifo would hang).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import signal
import stat
import tarfile
from collections.abc import Callable, Collection
from pathlib import Path

from environments.sandboxes import protocol
from environments.sandboxes.protocol import ExportTooLarge


def host_path(workspace: Path, workdir: str, path: str) -> Path:
    """The host path of sandbox ``path`` (absolute, or relative to ``workdir``).

    A ValueError names ``path`` when it lies outside ``workdir``.
    """
    full = posixpath.normpath(posixpath.join(workdir, path))
    if full != workdir and not full.startswith(workdir.rstrip("/") + "/"):
        raise ValueError(f"sandbox path {path!r} is outside the workspace {workdir!r}")
    rel = posixpath.relpath(full, workdir)
    return workspace if rel == "." else workspace / rel


def _is_inside(path: Path, root: Path) -> bool:
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root + os.sep)


def _existing_ancestor(path: Path) -> Path:
    while not os.path.lexists(path):
        path = path.parent
    return path


def copy_in(src: Path, dst: Path, uid: int | None, *, root: Path | None = None) -> None:
    """Copy host ``src`` (file or folder) to workspace path ``dst``; chown to ``uid`` if given.

    ``dst`` is the new name (a folder's contents merge into an existing folder there; a file
    onto an existing folder is an error). ``root`` is the workspace (defaults to ``dst``).
    """
    root = dst if root is None else root
    if not os.path.lexists(src):
        raise FileNotFoundError(f"upload source {src} does not exist")
    if dst.is_dir() and not dst.is_symlink() and not src.is_dir():
        raise IsADirectoryError(f"upload of file {src} onto folder {dst}: name the new file")
    if dst != root and not _is_inside(_existing_ancestor(dst.parent), root):
        raise ValueError(f"upload destination {dst} leads outside the workspace {root}")
    created = _missing_parents(dst.parent)
    dst.parent.mkdir(parents=True, exist_ok=True)
    _copy_node(src, dst, root)
    if uid is not None:
        for path in [*created, dst]:
            _chown_tree(path, uid)


def _missing_parents(path: Path) -> list[Path]:
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    return missing


def _copy_node(src: Path, dst: Path, root: Path) -> None:
    if dst != root and not _is_inside(dst.parent, root):
        raise ValueError(f"upload destination {dst} leads outside the workspace {root}")
    if dst.is_symlink():
        dst.unlink()
    if src.is_symlink():
        if os.path.lexists(dst):
            _remove(dst)
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        if os.path.lexists(dst) and not dst.is_dir():
            _remove(dst)
        dst.mkdir(exist_ok=True)
        for child in sorted(src.iterdir()):
            _copy_node(child, dst / child.name, root)
        if dst != root:  # the workspace itself keeps its own (writable) mode
            shutil.copystat(src, dst)
    elif stat.S_ISREG(src.stat().st_mode):
        if dst.is_dir():
            _remove(dst)
        shutil.copy2(src, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _chown_tree(path: Path, uid: int) -> None:
    os.lchown(path, uid, uid)
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            for name in [*dirnames, *filenames]:
                os.lchown(os.path.join(dirpath, name), uid, uid)


def copy_out(src: Path, workspace: Path, dst: Path) -> None:
    """Copy workspace path ``src`` to host ``dst``; refuse one that resolves outside."""
    if not os.path.lexists(src):
        raise FileNotFoundError(f"download source {src} does not exist in the sandbox")
    if not _is_inside(src, workspace):
        raise ValueError(
            f"download source {src} resolves to {os.path.realpath(src)}, outside the workspace"
        )
    real = Path(os.path.realpath(src))
    if real.is_dir():
        shutil.copytree(real, dst, symlinks=True, copy_function=_copy_regular, dirs_exist_ok=True)
    elif stat.S_ISREG(real.stat().st_mode):
        shutil.copy2(real, dst)
    else:
        raise ValueError(f"download source {src} is not a regular file or folder")


def _copy_regular(src: str, dst: str) -> None:
    if stat.S_ISREG(os.lstat(src).st_mode):
        shutil.copy2(src, dst)


def archive_folder(folder: Path, top: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
    """Write a tar of host ``folder`` to ``dst``, its members named ``top/...`` (the folder
    itself ``top``), as Docker's archive API names them. Read by the host, never following a
    link: folders, regular files (each opened without following links, without blocking on a
    fifo swapped in, and checked to be the file listed) and links as links; fifos, sockets and
    devices are left out, and so are the children of ``folder`` named in ``exclude``, with all
    they hold. Walked without recursion, so no nesting depth stops it. FileNotFoundError /
    NotADirectoryError when ``folder`` is missing or not a folder (a link to one included);
    PermissionError when part of it cannot be read; ExportTooLarge past
    ``protocol.MAX_EXPORT_BYTES`` of file data."""
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{folder} is not a folder")
    total = 0
    with tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as archive:
        pending = [(str(folder), top, info, frozenset(exclude))]
        while pending:
            path, name, node, skip = pending.pop()
            total += _archive_node(archive, path, name, node, total)
            if stat.S_ISDIR(node.st_mode):
                with os.scandir(path) as entries:
                    children = sorted(entry.name for entry in entries if entry.name not in skip)
                for child in reversed(children):  # popped in name order
                    child_path = os.path.join(path, child)
                    try:
                        child_info = os.lstat(child_path)
                    except FileNotFoundError:
                        continue
                    pending.append((child_path, f"{name}/{child}", child_info, frozenset()))


def _archive_node(
    archive: tarfile.TarFile, path: str, name: str, info: os.stat_result, total: int
) -> int:
    """Add one member (a folder without its children); the bytes of file data it added."""
    member = tarfile.TarInfo(name)
    member.mode, member.mtime = stat.S_IMODE(info.st_mode), int(info.st_mtime)
    if stat.S_ISDIR(info.st_mode):
        member.type = tarfile.DIRTYPE
        archive.addfile(member)
    elif stat.S_ISLNK(info.st_mode):
        member.type, member.linkname = tarfile.SYMTYPE, os.readlink(path)
        archive.addfile(member)
    elif stat.S_ISREG(info.st_mode):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            opened = os.fstat(handle.fileno())
            if not stat.S_ISREG(opened.st_mode) or opened.st_ino != info.st_ino:
                return 0  # swapped since it was listed: what is there now is not a file
            if total + opened.st_size > protocol.MAX_EXPORT_BYTES:
                raise ExportTooLarge(
                    f"the folder holds over {protocol.MAX_EXPORT_BYTES} bytes of file data ({name})"
                )
            member.size = opened.st_size
            archive.addfile(member, handle)
            return opened.st_size
    return 0


def kill_uid(uid: int, *, rounds: int = 5) -> int:
    """SIGKILL every process whose real uid is ``uid``; returns how many were signalled."""
    return kill_listed(lambda: [pid for pid in _pids() if _real_uid(pid) == uid], rounds=rounds)


def kill_listed(list_pids: Callable[[], list[int]], *, rounds: int = 5) -> int:
    """SIGKILL the processes ``list_pids()`` names, again while it names any (a process may
    fork while its siblings die), at most ``rounds`` times; returns how many were signalled."""
    killed = 0
    for _ in range(rounds):
        pids = list_pids()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                continue
    return killed


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _real_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
