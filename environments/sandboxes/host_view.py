"""What a bubblewrap sandbox sees of the host: the read-only mounts of every command
(``mount_args``), the one copy of ``/etc`` they share (``shared_etc``), and which workdirs can
be bound (``validate_workdir``). See ``bwrap.py`` for the isolation as a whole."""

from __future__ import annotations

import atexit
import os
import posixpath
import shutil
import sys
import tempfile
import threading
from pathlib import Path

TMPFS_BYTES = 256 * 1024 * 1024
ETC_ENTRIES = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "debian_version",
    "gitconfig",
    "hosts",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "protocols",
    "services",
    "ssl",
    "terminfo",
    "timezone",
    "tmux.conf",
)
SYSTEM_DIRS = ("/usr", "/etc", "/proc", "/dev", "/bin", "/sbin", "/lib", "/lib32", "/lib64")


def validate_workdir(workdir: str) -> str:
    """``workdir`` normalised; a ValueError names it when it is not a usable absolute path."""
    norm = posixpath.normpath(workdir)
    if not workdir.startswith("/") or norm == "/":
        raise ValueError(f"SandboxSpec.workdir must be an absolute path other than /: {workdir!r}")
    if any(norm == d or norm.startswith(d + "/") for d in SYSTEM_DIRS):
        raise ValueError(f"SandboxSpec.workdir {workdir!r} lies in a system folder {SYSTEM_DIRS}")
    for path in interpreter_dirs():
        if path == norm or path.startswith(norm + "/") or norm.startswith(path + "/"):
            raise ValueError(
                f"SandboxSpec.workdir {workdir!r} overlaps the interpreter folder {path} "
                "that the sandbox mounts read-only"
            )
    return norm


ETC_PREFIX = "thundersync-etc-"  # + the owner's pid: the process's /etc copy (shared_etc)
_etc_lock = threading.Lock()
_etc: tuple[int, Path] | None = None  # (the pid that made it, the copy)


def shared_etc() -> Path:
    """This process's copy of what a sandbox sees of ``/etc`` (``ETC_ENTRIES``, the
    ``/etc/python3*`` folders, and empty ``passwd`` and ``group`` that each sandbox's own
    cover), made once and bound read-only at ``/etc`` in every sandbox: one mount instead of a
    bind per entry, since bubblewrap reads the whole mount table for each bind it makes
    read-only (docs/measurements.md). Made again if it is gone (a temp folder cleaned) or was
    made by another process (a fork); removed at exit, or by the next process's ``reap_once``
    if this one dies."""
    global _etc
    with _etc_lock:
        if _etc is not None and _etc[0] == os.getpid() and _etc[1].is_dir():
            return _etc[1]
        folder = Path(tempfile.mkdtemp(prefix=f"{ETC_PREFIX}{os.getpid()}-", dir=etc_root()))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        etc = folder / "etc"
        etc.mkdir(mode=0o755)
        os.chmod(etc, 0o755)  # the sandbox's user must be able to read it, whatever the umask
        sources = [Path("/etc", name) for name in ETC_ENTRIES]
        for source in [*sources, *sorted(Path("/etc").glob("python3*"))]:
            _copy_entry(source, etc / source.name)
        for name in ("passwd", "group"):
            (etc / name).touch(mode=0o644)
        _etc = (os.getpid(), etc)
        return etc


def etc_root() -> str:
    """Where ``shared_etc`` copies to: ``/dev/shm`` where this user can write (memory: the
    copy's ~700 files and links are made far faster than on some disks), else the temp folder."""
    shm = "/dev/shm"
    writable = os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK)
    return shm if writable else tempfile.gettempdir()


def _copy_entry(source: Path, target: Path) -> None:
    """``source`` as a bind of it showed it: a link at the top followed, links inside a folder
    kept as links (resolved in the sandbox, as before); what this user cannot read is left
    out, as the sandbox's unprivileged user could not read it either."""
    try:
        if source.is_dir():
            shutil.copytree(source.resolve(), target, symlinks=True)
        elif source.exists():
            shutil.copy2(source, target)
    except (shutil.Error, OSError):  # unreadable parts (e.g. /etc/ssl/private as non-root)
        pass


def interpreter_dirs() -> list[str]:
    """The running Python's prefixes (venv and base), outside /usr, deduplicated."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    dirs.add(str(Path(sys.executable).parent.parent))
    dirs.add(str(Path(os.path.realpath(sys.executable)).parent.parent))
    kept = [d for d in sorted(dirs) if not (d == "/usr" or d.startswith("/usr/"))]
    return [d for d in kept if not any(d != o and d.startswith(o + "/") for o in kept)]


def mount_args(workspace: Path, etc_dir: Path, workdir: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind", str(shared_etc()), "/etc"]
    args += ["--ro-bind", str(etc_dir / "passwd"), "/etc/passwd"]
    args += ["--ro-bind", str(etc_dir / "group"), "/etc/group"]
    args += ["--proc", "/proc", "--dev", "/dev"]
    # Sticky and world-writable like a real /tmp: the sandbox user must be able to mktemp.
    # Mounted before the interpreter's folders, so a checkout under /tmp stays visible.
    args += ["--perms", "1777", "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp"]
    made: set[str] = {"/tmp", "/proc", "/dev"}
    for path in [*interpreter_dirs(), workdir]:
        for parent in reversed(Path(path).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        if path != workdir:
            args += ["--ro-bind", path, path]
    # The session's init starts in /; each command enters the workdir as the sandbox's user
    # (``bwrap_session.INIT``): bwrap's own --chdir runs without the capabilities it drops, so
    # a workdir the agent made 700 (its own, as its owner may) could no longer be entered.
    return [*args, "--bind", str(workspace), workdir, "--chdir", "/"]
