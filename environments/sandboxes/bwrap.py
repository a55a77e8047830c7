"""BwrapSandbox: a bubblewrap namespace over a private host workspace, running its commands.

The namespace is a *session* (``bwrap_session.py``): started by the first command, it runs the
sandbox's commands one after another, and a command's background processes are killed when it
ends. A command in a running session costs about what the command itself costs (a fresh
namespace per command cost ~20 ms of CPU and ~25 ms of wall time here). Isolation:

- Only what a task needs is visible, read-only (``host_view.py``): ``/usr`` (and the
  ``/bin``, ``/lib*`` links), a selected part of ``/etc`` (this process's copy of it,
  ``shared_etc``), and the running interpreter's prefixes (the venv and its base Python). The
  rest of the host (``/root``, ``/home``, ``/tmp``, the repository) is not mounted at all.
  ``/tmp`` is a private tmpfs that lives as long as the session (as a container's would);
  ``/proc`` and ``/dev`` are private.
- The workspace, a host temp dir, is bound read-write at ``spec.workdir`` (any absolute path,
  e.g. ``/workspace`` or ``/testbed``); it is also ``HOME``. Files persist between calls. It
  lies on a disk of its own of ``spec.disk_mb`` (``disk.py``), so filling it fails the
  agent's own commands with ENOSPC and nothing else.
- ``PUBLISHED_DIRS`` (``/tests``, ``/solution``, ``/logs`` with ``agent``, ``verifier`` and
  ``artifacts``) are fresh per-sandbox folders beside the workspace (on its disk) bound
  read-write at their real places, as Docker's root can create them: published Harbor and
  Terminal-Bench tasks hard-code them.
- New network namespace (only ``lo``), PID, IPC and UTS namespaces. When the command's shell
  exits, the session's init SIGKILLs every other process in the namespace before it reports
  the exit code, so background jobs, ``setsid`` and double-forked daemons never outlive their
  call; the init cannot be ptraced or read by the commands (non-dumpable), and a command that
  kills it ends its own session (reported as killed, exit 137; the next command starts a new
  one). A timeout kills bwrap, taking the namespace with it (the next command starts a new
  session), and ``--die-with-parent`` does the same when the owner dies.
- When run as root, the command runs as an unprivileged per-sandbox uid (no capabilities,
  ``no_new_privs``) rather than in a user namespace: a uid mapped to root is exempt from
  ``RLIMIT_NPROC``, and the per-sandbox uid is what lets the pids limit stop a fork bomb.
  Without root, bwrap makes a user namespace (``--unshare-all``) and the same rlimits apply.
- Making a user namespace inside fails with EPERM (a seccomp filter, ``seccomp.py``, which
  also says why bubblewrap 0.8's ``--disable-userns`` is not used).
- rlimits per command (set by the init before it execs the command): address space
  (``memory_mb``), processes (``pids``, the init not counted), file size (``MAX_FILE_BYTES``),
  CPU seconds (the timeout + 1). Where a memory cgroup can be made (``cgroup.py``; root with
  cgroup v1 here), ``memory_mb`` also bounds the sandbox's total
  memory; otherwise the total is only bounded by ``pids × memory_mb``. ``cpus`` is not
  enforced; ``/tmp`` is a tmpfs of ``host_view.TMPFS_BYTES``.
- Tools run behind the trainer: the session's processes at nice ``bwrap_session.NICE`` (10),
  and its scheduling autogroup (a new session is a group of its own, as heavy as the whole
  trainer) at the same nice where the host may set it (root). A preference for the shared
  cores, not an isolation boundary.
- ``close()`` may come from another thread (a run being cancelled): it kills the running
  command at once, and that ``execute`` raises SandboxError.

``PATH`` starts with the directory of the running interpreter (``Path(sys.executable).parent``)
so ``python``, ``python3`` and ``pytest`` inside the sandbox are the project's own.
"""

from __future__ import annotations

import errno
import math
import os
import posixpath
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Collection
from pathlib import Path

from environments.sandboxes import bwrap_session, cgroup, disk, host_view, seccomp
from environments.sandboxes.capture import OutputCapture
from environments.sandboxes.engines import PREREQUISITE_TIMEOUT_S, SandboxEngine
from environments.sandboxes.orphans import reap_once, remove_orphan_workspaces
from environments.sandboxes.protocol import (
    MAX_FILE_BYTES,
    ExecResult,
    NeedsDockerError,
    SandboxError,
    SandboxSpec,
)
from environments.sandboxes.workspace import (
    archive_folder,
    copy_in,
    copy_out,
    host_path,
    kill_listed,
    kill_uid,
)

BWRAP = "bwrap"
SANDBOX_USER = "sandbox"
MARKER_PREFIX = "thundersync-bwrap-"  # + the owner's pid: in every sandbox's argv and env
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

        def reap() -> None:
            remove_orphan_workspaces(MARKER_PREFIX)
            remove_orphan_workspaces(host_view.ETC_PREFIX, host_view.etc_root())
            cgroup.remove_orphans(MARKER_PREFIX)

        reap_once("bwrap", reap)
        self.spec = spec
        self.workdir = host_view.validate_workdir(spec.workdir)
        self.is_root = os.geteuid() == 0
        self.uid = random.randrange(1_000_000, 2_000_000) if self.is_root else os.getuid()
        self.root = Path(tempfile.mkdtemp(prefix=f"{MARKER_PREFIX}{os.getpid()}-"))
        self.marker = self.root.name
        self.workspace = self.root / "workspace"
        self._closed = False
        self._close_error: str | None = None
        self._session: bwrap_session.Session | None = None
        self._sessions: list[bwrap_session.Session] = []  # the running one, for the finalizer
        self._lock = threading.Lock()
        self._state_lock = threading.Lock()  # _closed and _session, between execute and close
        self._close_lock = threading.Lock()
        self.cgroup = cgroup.create(self.marker, spec.memory_mb)
        self._disks: list[Path] = []
        self._finalizer = weakref.finalize(
            self,
            _cleanup,
            self.root,
            self.uid,
            self.is_root,
            self.cgroup,
            self._disks,
            self._sessions,
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

    def _argv(self, results_fd: int, filter_fd: int | None) -> list[str]:
        """bwrap running the session's init (``bwrap_session.py``) as the sandbox's user."""
        argv = [BWRAP, "--die-with-parent", "--new-session"]
        if filter_fd is not None:
            argv += ["--seccomp", str(filter_fd)]
        if self.is_root:
            argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
            argv += ["--unshare-cgroup-try"]
        else:
            argv += ["--unshare-all"]
        argv += host_view.mount_args(self.workspace, self.root / "etc", self.workdir)
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
        argv += ["--"]
        limits = bwrap_session.Limits(
            self.spec.memory_mb * 1024 * 1024, self.spec.pids, MAX_FILE_BYTES
        )
        return argv + bwrap_session.init_argv(limits, results_fd, sys.executable, self.workdir)

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
            start = time.monotonic()
            deadline = start + timeout
            capture = OutputCapture(self.spec.max_output_bytes)
            code = self._run(cmd, timeout, capture, deadline)
            if code is None:  # the deadline
                if self._session is not None:
                    self._session.kill()
                    self._session.drain_after_kill(capture, DRAIN_AFTER_KILL_S)
                self._end_session()
            duration = time.monotonic() - start
        if self._closed:
            raise SandboxError(f"bwrap sandbox {self.marker} was closed while its command ran")
        output, truncated = capture.text()
        return ExecResult(
            output=output,
            exit_code=code,
            timed_out=code is None,
            duration_s=duration,
            truncated=truncated,
        )

    def _run(self, cmd: str, timeout: float, capture: OutputCapture, deadline: float) -> int | None:
        """``cmd``'s exit code in the session (started when there is none), or None at
        ``deadline``. A session that ended between commands (``--die-with-parent`` follows the
        thread that started it) is started again and the command sent to the new one; one that
        ends during the command reports it killed (137)."""
        for _ in range(2):
            if self._session is not None and self._session.proc.poll() is not None:
                self._end_session()  # bwrap is gone; its init may still be dying
            session = self._session or self._start(capture, deadline)
            if session is None:
                return None
            try:
                return session.run(cmd, math.ceil(timeout) + 1, capture, deadline)
            except bwrap_session.SessionLost as lost:
                self._end_session()
                if lost.sent or self._closed:
                    return bwrap_session.KILLED_EXIT_CODE  # e.g. the command killed its init
        raise SandboxError(f"bwrap sandbox {self.marker}: its session ended twice before a command")

    def _start(self, capture: OutputCapture, deadline: float) -> bwrap_session.Session | None:
        """Start the sandbox's session (None when ``deadline`` passed first); a ``close()``
        that came first kills it at once. SandboxError when bwrap could not set it up."""
        filter_fd = seccomp.program_fd()
        results_r, results_w = os.pipe()
        fds = (results_w,) if filter_fd is None else (results_w, filter_fd)
        try:
            proc = subprocess.Popen(
                cgroup.wrap(self.cgroup, self._argv(results_w, filter_fd)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=fds,
            )
        except OSError as exc:
            os.close(results_r)
            raise SandboxError(f"could not start bwrap for sandbox {self.marker}: {exc}") from exc
        finally:
            os.close(results_w)
            if filter_fd is not None:
                os.close(filter_fd)
        session = bwrap_session.Session(proc, results_r)
        with self._state_lock:
            self._session = session
            self._sessions.append(session)
            closed = self._closed
        if closed:
            session.kill()
        ready = session.wait_ready(capture, deadline)
        if ready:
            bwrap_session.lower_priority(proc.pid)
        if ready is False:
            self._end_session()
            if self._closed:
                return None
            output, _ = capture.text()
            raise SandboxError(f"bwrap could not set up sandbox {self.marker}: {output.strip()}")
        return session if ready else None

    def _end_session(self) -> None:
        """Kill the running session, if any, and release it."""
        with self._state_lock:
            session, self._session = self._session, None
            if session is not None:
                self._sessions.remove(session)
        if session is not None:
            session.close()

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
        """Nothing of a command outlives it (its session's init kills the rest when it ends);
        this also ends the session (the next command starts a new one) and, as root, kills the
        sandbox's processes, should any exist (``_kill_leftovers``)."""
        self._check_open()
        with self._lock:
            self._end_session()
            if self.is_root:
                _kill_leftovers(self.uid, self.cgroup)

    def close(self) -> None:
        """Kill any running command and the sandbox's processes; remove the workspace.
        Thread-safe: a concurrent ``execute`` raises SandboxError; a second call waits for the
        first to finish."""
        with self._state_lock:
            self._closed = True
            session = self._session
        if not self._lock.acquire(blocking=False):  # a command runs: it ends now
            if session is not None:
                session.kill()
            self._lock.acquire()
        try:
            self._end_session()
        finally:
            self._lock.release()
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


def _kill_leftovers(uid: int, group: Path | None) -> None:
    """Kill what is left of a sandbox run as root: the processes of its memory cgroup where it
    has one (all of them, read from the group), else of its uid (a scan of ``/proc``)."""
    if group is not None:
        kill_listed(lambda: cgroup.procs(group))
    else:
        kill_uid(uid)


def _cleanup(
    root: Path,
    uid: int,
    is_root: bool,
    group: Path | None,
    disks: list[Path],
    sessions: list[bwrap_session.Session],
) -> None:
    for session in list(sessions):
        session.close()
    if is_root:
        _kill_leftovers(uid, group)
    cgroup.remove(group)
    try:
        for workspace in disks:
            disk.remove(workspace)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def prerequisite_problem() -> str | None:
    """Why bubblewrap sandboxes cannot run on this machine (with the fix), or None when a trial
    sandbox ran ``true``."""
    if shutil.which(BWRAP) is None:
        return (
            f"--sandbox bwrap: bubblewrap ({BWRAP}) is not installed: "
            "apt-get install bubblewrap, or use --sandbox docker"
        )
    try:
        with BwrapSandbox(SandboxSpec()) as sandbox:
            result = sandbox.execute("true", timeout=PREREQUISITE_TIMEOUT_S)
    except SandboxError as exc:
        reason = (str(exc).strip().splitlines() or ["no output"])[-1]
        return (
            f"--sandbox bwrap: bubblewrap is installed but cannot start a sandbox here "
            f"({reason}); it needs user namespaces (or root), or use --sandbox docker"
        )
    if result.exit_code != 0:
        shown = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        return (
            f"--sandbox bwrap: a trial sandbox failed to run `true` ({shown}); use --sandbox docker"
        )
    return None


ENGINE = SandboxEngine(
    name="bwrap",
    title="bubblewrap",
    capabilities=frozenset(),
    factory=BwrapSandbox,
    prerequisites=prerequisite_problem,
)
"""Runs on the host's files (standing for ``BASE_IMAGE``): no image builds, no other image,
no workspace over a system or interpreter folder, total memory bounded only where a memory
cgroup can be made (``cgroup.py``)."""
