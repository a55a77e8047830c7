"""BwrapSandbox: each command in a fresh bubblewrap namespace over a private host workspace.

Isolation, per ``execute`` call:

- Only what a task needs is visible, read-only (``host_view.py``): ``/usr`` (and the
  ``/bin``, ``/lib*`` links), a selected part of ``/etc`` (this process's copy of it,
  ``shared_etc``), and the running interpreter's prefixes (the venv and its base Python). The
  rest of the host (``/root``, ``/home``, ``/tmp``, the repository) is not mounted at all.
  ``/tmp`` is a fresh tmpfs; ``/proc`` and ``/dev`` are private.
- The workspace, a host temp dir, is bound read-write at ``spec.workdir`` (any absolute path,
  e.g. ``/workspace`` or ``/testbed``); it is also ``HOME``. Files persist between calls. It
  lies on a disk of its own of ``spec.disk_mb`` (``disk.py``), so filling it fails the
  agent's own commands with ENOSPC and nothing else.
- ``PUBLISHED_DIRS`` (``/tests``, ``/solution``, ``/logs`` with ``agent``, ``verifier`` and
  ``artifacts``) are fresh per-sandbox folders beside the workspace (on its disk) bound
  read-write at their real places, as Docker's root can create them: published Harbor and
  Terminal-Bench tasks hard-code them.
- New network namespace (only ``lo``), PID, IPC and UTS namespaces. When the command's shell
  exits, the namespace's init exits and the kernel kills every process left in it, so
  background jobs, ``setsid`` and double-forked daemons never outlive their call; a timeout
  kills bwrap, and ``--die-with-parent`` takes the namespace down with it.
- When run as root, the command runs as an unprivileged per-sandbox uid (no capabilities,
  ``no_new_privs``) rather than in a user namespace: a uid mapped to root is exempt from
  ``RLIMIT_NPROC``, and the per-sandbox uid is what lets the pids limit stop a fork bomb.
  Without root, bwrap makes a user namespace (``--unshare-all``) and the same rlimits apply.
- Making a user namespace inside fails with EPERM (a seccomp filter, ``seccomp.py``, which
  also says why bubblewrap 0.8's ``--disable-userns`` is not used).
- rlimits via ``prlimit``: address space (``memory_mb``), processes (``pids``), file size
  (``MAX_FILE_BYTES``), CPU seconds (the timeout + 1). Where a memory cgroup can be made
  (``cgroup.py``; root with cgroup v1 here), ``memory_mb`` also bounds the sandbox's total
  memory; otherwise the total is only bounded by ``pids × memory_mb``. ``cpus`` is not
  enforced; ``/tmp`` is a tmpfs of ``host_view.TMPFS_BYTES``.
- ``close()`` may come from another thread (a run being cancelled): it kills the running
  command at once, and that ``execute`` raises SandboxError.

``PATH`` starts with the directory of the running interpreter (``Path(sys.executable).parent``)
so ``python``, ``python3`` and ``pytest`` inside the sandbox are the project's own.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import posixpath
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Collection
from pathlib import Path

from environments.sandboxes import cgroup, disk, host_view, seccomp
from environments.sandboxes.capture import OutputCapture, read_fd_until
from environments.sandboxes.orphans import reap_once, remove_orphan_workspaces
from environments.sandboxes.protocol import ExecResult, NeedsDockerError, SandboxError, SandboxSpec
from environments.sandboxes.workspace import (
    archive_folder,
    copy_in,
    copy_out,
    host_path,
    kill_listed,
    kill_uid,
)

BWRAP = "bwrap"
MAX_FILE_BYTES = 256 * 1024 * 1024
SANDBOX_USER = "sandbox"
MARKER_PREFIX = "thundersync-bwrap-"  # + the owner's pid: in every sandbox's argv and env
MAX_ARGV_CMD_BYTES = 64 * 1024  # longer commands go through a file (one argv string <= 128 KiB)
CMD_FILE = "/run/thundersync/cmd"
DRAIN_AFTER_KILL_S = 0.5
PUBLISHED_DIRS = ("/tests", "/solution", "/logs")
"""Folders published Harbor and Terminal-Bench tasks hard-code (tests in /tests, the oracle's
files in /solution, /logs/verifier/reward.txt); ``upload``/``download`` reach them too."""
LOG_DIRS = ("agent", "verifier", "artifacts")


class BwrapSandbox:
    """A bubblewrap sandbox; see the module docstring for what it isolates and how."""

    def __init__(self, spec: SandboxSpec) -> None:
        if spec.build_context is not None:
            raise NeedsDockerError(
                f"SandboxSpec.build_context={spec.build_context} needs a Docker build; "
                "bubblewrap runs only tasks whose files need no build step"
            )
        if shutil.which(BWRAP) is None:
            raise SandboxError("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
        reap_once(
            "bwrap",
            lambda: (
                remove_orphan_workspaces(MARKER_PREFIX),
                remove_orphan_workspaces(host_view.ETC_PREFIX, host_view.etc_root()),
                cgroup.remove_orphans(MARKER_PREFIX),
            ),
        )
        self.spec = spec
        self.workdir = host_view.validate_workdir(spec.workdir)
        self.is_root = os.geteuid() == 0
        self.uid = random.randrange(1_000_000, 2_000_000) if self.is_root else os.getuid()
        self.root = Path(tempfile.mkdtemp(prefix=f"{MARKER_PREFIX}{os.getpid()}-"))
        self.marker = self.root.name
        self.workspace = self.root / "workspace"
        self._closed = False
        self._close_error: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._state_lock = threading.Lock()  # _closed and _proc, between execute and close
        self._close_lock = threading.Lock()
        self.cgroup = cgroup.create(self.marker, spec.memory_mb)
        self._disks: list[Path] = []
        self._finalizer = weakref.finalize(
            self, _cleanup, self.root, self.uid, self.is_root, self.cgroup, self._disks
        )
        try:
            self._make_workspace()
            self.published = self._make_published()
            self._write_identity()
        except BaseException:
            self.close()
            raise

    def _make_workspace(self) -> None:
        on_disk = disk.create(self.root, self.spec.disk_mb)
        if on_disk is None:
            self.workspace.mkdir()
        else:
            self._disks.append(on_disk)
            self.workspace = on_disk
        files = self.spec.files
        try:
            if files is not None:
                copy_in(Path(files), self.workspace, self.uid if self.is_root else None)
            elif self.is_root:
                os.chown(self.workspace, self.uid, self.uid)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            raise SandboxError(
                f"the task files {files} do not fit the workspace disk of sandbox {self.marker} "
                f"(SandboxSpec.disk_mb={self.spec.disk_mb})"
            ) from exc

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make_published(self) -> dict[str, Path]:
        """A fresh host folder for each of ``PUBLISHED_DIRS`` that does not overlap the workdir,
        beside the workspace: on its disk, when it has one, so the disk bounds them too."""
        made: dict[str, Path] = {}
        for inside in PUBLISHED_DIRS:
            if posixpath.commonpath([inside, self.workdir]) in (inside, self.workdir):
                continue
            host = self.workspace.parent / "published" / inside.strip("/")
            folders = [host, *(host / name for name in LOG_DIRS if inside == "/logs")]
            for folder in folders:
                folder.mkdir(parents=True)
                if self.is_root:
                    os.chown(folder, self.uid, self.uid)
            made[inside] = host
        return made

    def _host_path(self, path: str) -> tuple[Path, Path]:
        """(host path, the host folder it must stay in) of sandbox ``path``: a published
        folder's or the workspace's (ValueError naming ``path`` when it is in neither)."""
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        for inside, host in self.published.items():
            if full == inside or full.startswith(inside + "/"):
                return host_path(host, inside, full), host
        return host_path(self.workspace, self.workdir, path), self.workspace

    def _write_identity(self) -> None:
        etc = self.root / "etc"
        etc.mkdir()
        passwd = Path("/etc/passwd").read_text() if Path("/etc/passwd").exists() else ""
        group = Path("/etc/group").read_text() if Path("/etc/group").exists() else ""
        line = f"{SANDBOX_USER}:x:{self.uid}:{self.uid}:sandbox:{self.workdir}:/bin/bash\n"
        (etc / "passwd").write_text(passwd + ("" if self.uid == os.getuid() else line))
        glines = f"{SANDBOX_USER}:x:{self.uid}:\n"
        (etc / "group").write_text(group + ("" if self.uid == os.getgid() else glines))

    def _argv(self, cmd: str, timeout: float, ready_fd: int, filter_fd: int | None) -> list[str]:
        argv = [BWRAP, "--die-with-parent", "--new-session"]
        if filter_fd is not None:
            argv += ["--seccomp", str(filter_fd)]
        if self.is_root:
            argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
            argv += ["--unshare-cgroup-try"]
        else:
            argv += ["--unshare-all"]
        cmd, cmd_mount = self._command(cmd)
        argv += host_view.mount_args(self.workspace, self.root / "etc", self.workdir) + cmd_mount
        for inside, host in self.published.items():
            argv += ["--bind", str(host), inside]
        argv += ["--clearenv"]
        for key, value in self._environment().items():
            argv += ["--setenv", key, value]
        if self.is_root:
            argv += ["--cap-drop", "ALL"]
            for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):
                argv += ["--cap-add", cap]
            argv += ["--", "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}"]
            argv += ["--clear-groups", "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
        else:
            argv += ["--"]
        spec = self.spec
        cpu_s = math.ceil(timeout) + 1
        argv += ["prlimit", f"--as={spec.memory_mb * 1024 * 1024}", f"--nproc={spec.pids}"]
        argv += [f"--fsize={MAX_FILE_BYTES}", f"--cpu={cpu_s}", "--core=0"]
        # The prelude proves the sandbox was set up (bwrap's own failures also exit 1) and
        # closes the pipe before the command runs.
        prelude = f'printf ok >&{ready_fd}; exec {ready_fd}>&-; exec bash -c "$1"'
        return [*argv, "--", "bash", "-c", prelude, "bash", cmd]

    def _command(self, cmd: str) -> tuple[str, list[str]]:
        """``cmd`` itself, or for a long one a line sourcing it from a read-only file."""
        if len(cmd.encode()) <= MAX_ARGV_CMD_BYTES:
            return cmd, []
        path = self.root / "cmd"
        path.write_text(cmd)
        dirs = ["--perms", "0755", "--dir", "/run", "--perms", "0755", "--dir", "/run/thundersync"]
        return f". {CMD_FILE}", [*dirs, "--ro-bind", str(path), CMD_FILE]

    def _environment(self) -> dict[str, str]:
        path = f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
        env = {
            "PATH": path + ":/sbin:/bin",
            "HOME": self.workdir,
            "USER": SANDBOX_USER,
            "LOGNAME": SANDBOX_USER,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "TERM": "dumb",
            "THUNDERSYNC_SANDBOX": self.marker,
        }
        env.update(self.spec.env)
        return env

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        """Run ``cmd`` with ``bash -c`` in ``workdir``; kill everything after ``timeout`` s."""
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        with self._lock:
            self._check_open()
            ready_r, ready_w = os.pipe()
            start = time.monotonic()
            try:
                proc = self._start(cmd, timeout, ready_w)
            except BaseException:
                os.close(ready_r)
                raise
            finally:
                os.close(ready_w)
            capture = OutputCapture(self.spec.max_output_bytes)
            try:
                finished = _run_to_deadline(proc, capture, start + timeout)
                started = _read_all(ready_r)
            finally:
                os.close(ready_r)
                _kill_group(proc)
                proc.stdout.close()
                proc.wait()
                self._proc = None
            duration = time.monotonic() - start
        if self._closed:
            raise SandboxError(f"bwrap sandbox {self.marker} was closed while its command ran")
        output, truncated = capture.text()
        if finished and not started:
            raise SandboxError(f"bwrap could not set up sandbox {self.marker}: {output.strip()}")
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return ExecResult(
            output=output,
            exit_code=code if finished else None,
            timed_out=not finished,
            duration_s=duration,
            truncated=truncated,
        )

    def _start(self, cmd: str, timeout: float, ready_w: int) -> subprocess.Popen[bytes]:
        """Start the command's bwrap; a ``close()`` that came first kills it at once."""
        filter_fd = seccomp.program_fd()
        fds = (ready_w,) if filter_fd is None else (ready_w, filter_fd)
        try:
            proc = subprocess.Popen(
                cgroup.wrap(self.cgroup, self._argv(cmd, timeout, ready_w, filter_fd)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=fds,
            )
        except OSError as exc:
            raise SandboxError(f"could not start bwrap for sandbox {self.marker}: {exc}") from exc
        finally:
            if filter_fd is not None:
                os.close(filter_fd)
        with self._state_lock:
            self._proc = proc
            closed = self._closed
        if closed:
            _kill_group(proc)
        return proc

    def upload(self, src: Path, dst: str) -> None:
        """Copy a host file or folder to ``dst`` (inside ``workdir`` or a published folder)."""
        self._check_open()
        target, root = self._host_path(dst)
        copy_in(Path(src), target, self.uid if self.is_root else None, root=root)

    def download(self, src: str, dst: Path) -> None:
        """Copy ``src`` (inside ``workdir`` or a published folder) to the host; symlinks are
        copied as links."""
        self._check_open()
        source, root = self._host_path(src)
        copy_out(source, root, Path(dst))

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        """Archive folder ``path`` (inside ``workdir`` or a published folder) to host ``dst``:
        read by the host from the workspace on disk, never following links
        (``workspace.archive_folder``); see the protocol."""
        self._check_open()
        source, _ = self._host_path(path)
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        with self._lock:  # no command of the agent runs while the folder is read
            archive_folder(source, posixpath.basename(full) or ".", Path(dst), exclude=exclude)

    def stop_processes(self) -> None:
        """Nothing of a command outlives it (its PID namespace dies with it); as root, the
        sandbox's processes are killed as well, should any exist (``_kill_leftovers``)."""
        self._check_open()
        with self._lock:
            if self.is_root:
                _kill_leftovers(self.uid, self.cgroup)

    def close(self) -> None:
        """Kill any running command and the sandbox's processes; remove the workspace.
        Thread-safe: a concurrent ``execute`` raises SandboxError; a second call waits for the
        first to finish."""
        with self._state_lock:
            self._closed = True
            proc = self._proc
        if proc is not None:
            _kill_group(proc)
        with self._close_lock:
            try:
                self._finalizer()
            except SandboxError as exc:
                self._close_error = str(exc)
        if self._close_error is not None:
            raise SandboxError(self._close_error)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"bwrap sandbox {self.marker} is closed")


def _run_to_deadline(
    proc: subprocess.Popen[bytes], capture: OutputCapture, deadline: float
) -> bool:
    """Capture output until the command exits (True) or ``deadline`` passes (False)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    finished = read_fd_until(fd, capture, deadline)
    if finished:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            finished = False
    if not finished:
        _kill_group(proc)
        read_fd_until(fd, capture, time.monotonic() + DRAIN_AFTER_KILL_S)
    return finished


def _read_all(fd: int) -> bytes:
    """What the prelude wrote to the ready pipe (nothing when bwrap failed before it ran)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            os.killpg(proc.pid, signal.SIGKILL)


def _kill_leftovers(uid: int, group: Path | None) -> None:
    """Kill what is left of a sandbox run as root: the processes of its memory cgroup where it
    has one (all of them, read from the group), else of its uid (a scan of ``/proc``)."""
    if group is not None:
        kill_listed(lambda: cgroup.procs(group))
    else:
        kill_uid(uid)


def _cleanup(root: Path, uid: int, is_root: bool, group: Path | None, disks: list[Path]) -> None:
    if is_root:
        _kill_leftovers(uid, group)
    cgroup.remove(group)
    try:
        for workspace in disks:
            disk.remove(workspace)
    finally:
        shutil.rmtree(root, ignore_errors=True)
