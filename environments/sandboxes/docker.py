"""DockerSandbox: commands run by ``docker exec`` in a long-lived, network-less container.

A spec with ``services`` puts it instead in their network namespace (loopback only, no route
out), reached as ``main`` (``compose.py``); they are removed with it. ``services_network`` names
that namespace, for a spec's ``network`` to join (without owning) another sandbox's services.

The container runs ``sleep infinity`` under Docker's init with ``network_mode="none"`` and
memory / CPU / pids limits, labelled ``thundersync=1``. Each ``execute`` runs a small
``/bin/sh`` wrapper that starts ``bash -c CMD`` under ``timeout -s KILL`` (all three by full
path: an image whose ``PATH`` starts in the work folder must not give the agent's programs the
grader's commands) and, when the command ends, SIGKILLs every other process in the container
(so background jobs and ``setsid`` daemons never outlive their call, as in the bubblewrap
sandbox). A host-side deadline backs this up: if the exec has not ended shortly after its
timeout, or the container died (``kill -9 -1`` kills its ``sleep``), the container is killed
and restarted; its files persist. The exec's output is its framed stream, read from what the
SDK's HTTP reader buffered past the upgrade's headers first (``capture._buffered``: under load a
short command's whole output came with them, and was lost), then its exit status.

Paths given to ``upload``/``download`` are container paths (relative ones are relative to
``workdir``); the container is its own filesystem, so unlike bubblewrap any path is allowed.
Downloads are unpacked with tarfile's ``data`` filter, so links in them cannot reach the host.

The workspace (``workdir``) is bounded by ``spec.disk_mb``: a host disk (``disk.py``) served
to the container as a named volume (the ``local`` driver's bind), which Docker fills with the
image's own ``workdir`` content when the container is made, so images whose ``WORKDIR`` holds
the task's files keep them, and ``put_archive`` writes onto it. A tmpfs would lose the files on
the restarts above and is invisible to ``put_archive``; overlay2's ``--storage-opt size`` needs
XFS with project quotas (this machine's overlay2 lies on ext4). The rest of the container's
writable layer is bounded only by the file size limit. The disk needs root and a daemon on this
host (a ``unix://`` socket); elsewhere the workspace is unbounded, with a warning.

Every failure of the daemon (it died, or its socket is gone), in every call including
``close()``, raises SandboxError: an infrastructure failure. ``close()`` may come from another
thread: it removes the container at once, and a running ``execute`` raises SandboxError.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.sandboxes import compose, disk, docker_archive
from environments.sandboxes.capture import OutputCapture, read_docker_frames_until
from environments.sandboxes.docker_daemon import (
    API_TIMEOUT_S,
    daemon_client,
    exec_bounded,
    exec_status,
    make_workspace_volume,
    restart_failure,
)
from environments.sandboxes.engines import CAPABILITIES, SandboxEngine
from environments.sandboxes.image_build import LABEL, build_image
from environments.sandboxes.orphans import (
    reap_once,
    remove_orphan_containers,
    remove_orphan_workspaces,
)
from environments.sandboxes.protocol import (
    MAX_ARGV_CMD_BYTES,
    MAX_FILE_BYTES,
    AgentBrokeSandbox,
    ExecResult,
    SandboxError,
    SandboxSpec,
)

BASE_IMAGE = "thundersync/base:bookworm"
DISK_PREFIX = "thundersync-docker-"  # + the owner's pid: the host folders of workspace disks

HOST_GRACE_S = 0.5
CMD_FILE = "/tmp/.thundersync-cmd"
WRAPPER = r"""
ulimit -c 0
ulimit -f "$4"
t=/usr/bin/timeout; [ -x $t ] || t=/bin/timeout
b=/bin/bash; [ -x $b ] || b=/usr/bin/bash
$t -s KILL "$2" $b -c "$1" 2>&1
rc=$?
for round in 1 2 3 4 5; do
  alive=0
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = 1 ] || [ "$pid" = "$3" ] || [ "$pid" = "$$" ] ||
      { kill -9 "$pid" 2>/dev/null && alive=1; }
  done
  [ "$alive" = 0 ] && break
done
exit $rc
"""


@dataclass(slots=True)
class _HostDisk:
    """What ``close`` removes beside the container (the workspace disk's host side, the
    services), filled in as it is made (a finalizer cannot hold self)."""

    root: Path | None = None
    workspace: Path | None = None
    services: compose.Services | None = None


MAIN_PROCESS_WAIT_S = 10.0
"""How long a started container's init may take to fork its main program."""
STOP_GRACE_S = 5.0
"""How long a container whose init just died may still report itself running (seen loaded)."""


class DockerSandbox:
    """A Docker sandbox; see the module docstring for how commands are run and bounded."""

    def __init__(self, spec: SandboxSpec, *, client: Any = None) -> None:
        if not spec.workdir.startswith("/") or posixpath.normpath(spec.workdir) == "/":
            raise ValueError(f"SandboxSpec.workdir must be absolute, not /: {spec.workdir!r}")
        if spec.network is not None and not compose.is_services_network(spec.network):
            raise ValueError(f"SandboxSpec.network must be a services_network: {spec.network!r}")
        self.spec = spec
        self.workdir = posixpath.normpath(spec.workdir)
        self.marker = f"thundersync-{uuid.uuid4().hex[:12]}"
        self._client = client if client is not None else daemon_client()
        reap_once("docker", self._reap_orphans)
        self._closed = False
        self._close_error: str | None = None
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._container: Any = None
        self.services_network: str | None = None
        self.exec_user: str | None = None  # exec -u (Harbor's user fields); None: the image's
        self._disk = _HostDisk()
        self._finalizer = weakref.finalize(self, _remove, self._client, self.marker, self._disk)
        try:
            image = spec.image or BASE_IMAGE
            if spec.build_context is not None:
                image = build_image(self._client, Path(spec.build_context))
            make_workspace_volume(
                self._client, self.marker, spec.disk_mb, self._labels(), self._disk, DISK_PREFIX
            )
            network = spec.network
            if spec.services:
                self._disk.services = compose.Services()
                network = compose.start(
                    self._client, self._disk.services, spec.services, self.marker, self._labels()
                )
            self.services_network = network
            self._container = self._run(image, network)
            self._main_pid = self._find_main_pid()
            if self._disk.services is not None:
                compose.check_running(self._client, self._disk.services, spec.services)
            if spec.files is not None:
                self._put(Path(spec.files), self.workdir)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reap_orphans(self) -> None:
        try:
            remove_orphan_containers(self._client, LABEL)
        except Exception as exc:
            raise SandboxError(f"cannot list containers to reap orphans: {exc}") from exc
        remove_orphan_workspaces(DISK_PREFIX)

    def _run(self, image: str, network: str | None) -> Any:
        """The container, network-less, or in the services' namespace (``network`` mode)."""
        spec = self.spec
        volumes = {}
        if self._disk.workspace is not None:
            volumes = {self.marker: {"bind": self.workdir, "mode": "rw"}}
        try:
            return self._client.containers.run(
                image,
                command=["sleep", "infinity"],
                name=self.marker,
                detach=True,
                init=True,
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",
                nano_cpus=int(spec.cpus * 1e9),
                pids_limit=spec.pids,
                working_dir=self.workdir,
                environment=dict(spec.env),
                labels=self._labels(),
                auto_remove=False,
                volumes=volumes,
                network_mode=network or "none",
            )
        except Exception as exc:
            hint = ""
            if "no space left" in str(exc).lower():
                hint = f" (is the image's {self.workdir} larger than disk_mb={spec.disk_mb}?)"
            raise SandboxError(
                f"could not start container from image {image!r}: {exc}{hint}"
            ) from exc

    def _labels(self) -> dict[str, str]:
        return {
            LABEL: "1",
            f"{LABEL}.sandbox": self.marker,
            f"{LABEL}.owner_pid": str(os.getpid()),
            f"{LABEL}.host": os.uname().nodename,
        }

    def _find_main_pid(self) -> str:
        """The pid of the container's main program (``sleep``), the child of its init. Right
        after a start the init may not have forked it yet (seen under load): the children
        are read again, every 50 ms for up to ``MAIN_PROCESS_WAIT_S``, while the container
        runs; an empty list after that is an error."""
        deadline = time.monotonic() + MAIN_PROCESS_WAIT_S
        while True:
            code, out = self._children_of_init(deadline)
            # the agent's code may have replaced `cat` (root in the container): what is no pid
            # is none (bytes of no UTF-8 failed a strict decode: red team, 2026-12-07)
            pids = out.split() if code == 0 else []
            if pids and pids[0].isascii() and pids[0].isdigit():
                return pids[0]
            if time.monotonic() >= deadline or not self._is_running():
                raise SandboxError(
                    f"container {self.marker}: cannot find its main process: {out[:200]!r}"
                )
            time.sleep(0.05)

    def _children_of_init(self, deadline: float) -> tuple[int | None, str]:
        """``cat /proc/1/task/1/children`` in the container: its exit status (None: no answer
        by ``deadline``) and the start of its output, bounded both ways (``exec_bounded``)."""
        argv = ["/bin/cat", "/proc/1/task/1/children"]
        until = max(deadline, time.monotonic() + 1)
        try:
            exec_id, text = exec_bounded(self._client, self._container.id, argv, until)
        except Exception as exc:
            raise SandboxError(f"container {self.marker}: cannot exec: {exc}") from exc
        return (exec_status(self._client, exec_id, self.marker)[0] if exec_id else None), text

    def _restart(self) -> None:
        """Kill every process by restarting the container (its files persist). The daemon's
        failures raise SandboxError; one that does not start again while a fresh one does
        (``restart_failure``), or not keep running (its main program gone), AgentBrokeSandbox."""
        with contextlib.suppress(Exception):  # already stopped: start() is what matters
            self._container.kill()
        try:
            self._container.start()
        except Exception as exc:
            raise restart_failure(self._client, self._container, self._labels(), exc) from exc
        try:
            self._main_pid = self._find_main_pid()
        except SandboxError as exc:
            if self._is_running() and "cannot exec" in str(exc):
                raise  # the daemon refused an exec into a running container
            raise AgentBrokeSandbox(
                f"container {self.marker} does not run after a restart (its main program "
                f"`sleep` or `cat`, which finds it, replaced or deleted?): {exc}"
            ) from exc

    def stop_processes(self) -> None:
        """Kill every process in the container through the daemon (``kill``: SIGKILL to its
        init, so the whole PID namespace dies), whatever the agent did to the programs the
        exec wrapper uses; the container stays stopped until the next ``execute`` restarts it
        (its files persist), and the archive API works on it meanwhile."""
        with self._lock:
            self._check_open()
            compose.check_alive(self._client, self._disk.services, self.spec.services)
            if not self._is_running():
                return
            try:
                self._container.kill()
                self._container.wait(timeout=API_TIMEOUT_S)
            except Exception as exc:
                if self._is_running():
                    msg = f"container {self.marker}: cannot kill its processes: {exc}"
                    raise SandboxError(msg) from exc

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        """Run ``cmd`` with ``bash -c`` in ``workdir``; kill everything after ``timeout`` s."""
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        with self._lock:
            self._check_open()
            try:
                result = self._execute(cmd, timeout)
            except Exception as exc:
                if self._closed:
                    raise self._closed_while_running() from exc
                if isinstance(exc, (SandboxError, AgentBrokeSandbox)):
                    raise  # AgentBrokeSandbox: a restart found the agent's doing (not infra)
                # a broken stream or an SDK error the call sites did not name: still the daemon's
                raise SandboxError(f"container {self.marker}: {type(exc).__name__}: {exc}") from exc
        if self._closed:
            raise self._closed_while_running()
        return result

    def _closed_while_running(self) -> SandboxError:
        return SandboxError(f"docker sandbox {self.marker} was closed while its command ran")

    def _execute(self, cmd: str, timeout: float) -> ExecResult:
        # A command may kill the container's main process (``kill -9 -1``), stopping the
        # container; it is restarted (files persist) and an exec that it broke is retried once
        # (the daemon may still say "running" then: ``_stops`` gives it STOP_GRACE_S).
        for attempt in (0, 1):
            if not self._is_running():
                self._restart()
            try:
                result, started = self._exec_once(cmd, timeout)
            except SandboxError:
                if attempt or not self._stops():
                    raise
                continue
            if not started and not attempt and self._stops():
                continue  # the runtime refused it (126, no pid): the init had died
            return result
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _stops(self) -> bool:
        """Whether the container is stopped, or stops within ``STOP_GRACE_S``."""
        if self._is_running():
            with contextlib.suppress(Exception):  # the timeout: still running
                self._container.wait(timeout=STOP_GRACE_S, condition="not-running")
        return not self._is_running()

    def _exec_once(self, cmd: str, timeout: float) -> tuple[ExecResult, bool]:
        """The result, and whether the wrapper started (the runtime gave it a pid)."""
        exec_id = self._create_exec(cmd, timeout)
        start = time.monotonic()
        capture = OutputCapture(self.spec.max_output_bytes)
        try:
            sock = self._client.api.exec_start(exec_id, socket=True)
        except Exception as exc:
            raise SandboxError(f"container {self.marker}: exec failed to start: {exc}") from exc
        try:
            ended = read_docker_frames_until(sock, capture, start + timeout + HOST_GRACE_S)
        finally:
            sock.close()
        duration = time.monotonic() - start
        code, started = exec_status(self._client, exec_id, self.marker) if ended else (None, True)
        if not ended:
            self._restart()
        timed_out = not ended or (code == 137 and duration >= timeout - 0.05)
        output, truncated = capture.text()
        result = ExecResult(
            output=output,
            exit_code=None if timed_out else code,
            timed_out=timed_out,
            duration_s=duration,
            truncated=truncated,
        )
        return result, started

    def _is_running(self) -> bool:
        try:
            self._container.reload()
        except Exception as exc:
            raise SandboxError(f"container {self.marker} is gone: {exc}") from exc
        return self._container.status == "running"

    def _create_exec(self, cmd: str, timeout: float) -> str:
        if len(cmd.encode()) > MAX_ARGV_CMD_BYTES:
            docker_archive.put_bytes(self._container, self.marker, cmd.encode(), CMD_FILE)
            cmd = f". {CMD_FILE}"
        blocks = str(MAX_FILE_BYTES // 512)
        argv = [
            "/bin/sh",
            "-c",
            WRAPPER,
            "thundersync-exec",
            cmd,
            f"{timeout:.3f}",
            self._main_pid,
            blocks,
        ]
        try:
            created = self._client.api.exec_create(
                self._container.id,
                argv,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                workdir=self.workdir,
                environment=dict(self.spec.env),
                user=self.exec_user or "",
            )
        except Exception as exc:
            raise SandboxError(f"container {self.marker}: cannot exec: {exc}") from exc
        return created["Id"]

    def upload(self, src: Path, dst: str) -> None:
        """Copy a host file or folder to container path ``dst`` (its full new name)."""
        self._check_open()
        self._put(Path(src), posixpath.join(self.workdir, dst))

    def _put(self, src: Path, dst: str) -> None:
        docker_archive.put(self._client, self._container, self.marker, src, dst)

    def download(self, src: str, dst: Path) -> None:
        """Copy container path ``src`` to host path ``dst`` (its full new name)."""
        self._check_open()
        path = posixpath.normpath(posixpath.join(self.workdir, src))
        docker_archive.get(self._container, self.marker, path, Path(dst))

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        """Archive container folder ``path`` to host ``dst`` with the daemon's archive API
        (``get_archive``, which never runs a program in the container): see the protocol.
        The API cannot leave anything out: ``exclude``'s members are dropped as the archive
        streams past, never written to the host."""
        self._check_open()
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        with self._lock:
            docker_archive.export(
                self._client, self._container, self.marker, full, Path(dst), exclude
            )

    def close(self) -> None:
        """Remove the container (with force), its volume and disk; safe to call twice and
        from another thread (a second call waits for the first)."""
        self._closed = True
        with self._close_lock:
            try:
                self._finalizer()
            except SandboxError as exc:
                self._close_error = str(exc)
        if self._close_error is not None:
            raise SandboxError(self._close_error)

    def service(self, name: str) -> compose.ServiceSandbox | None:
        """Compose service ``name`` beside this sandbox (collect hooks, artifacts), or None."""
        self._check_open()
        return compose.service_sandbox(self._client, self._disk.services, name, self.marker)

    def check_services(self, until: float | None = None) -> None:
        """``HasServices``: an error when a service has exited since it started (before
        ``until``)."""
        compose.check_alive(self._client, self._disk.services, self.spec.services, until=until)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"docker sandbox {self.marker} is closed")


def _remove(client: Any, name: str, host: _HostDisk) -> None:
    """Remove the container, then its volume and disk; the host side goes even when the daemon
    cannot be reached, and the daemon's failures are raised after."""
    errors = []
    removals = [("container", client.containers.get)]
    if host.workspace is not None:
        removals.append(("volume", client.volumes.get))
    for what, get in removals:
        try:
            get(name).remove(force=True)
        except Exception as exc:
            if type(exc).__name__ != "NotFound":
                errors.append(f"could not remove {what} {name}: {exc}")
        if what == "container" and host.services is not None:
            errors.extend(compose.remove(client, host.services))
    try:
        disk.remove(host.workspace)
    finally:
        if host.root is not None:
            shutil.rmtree(host.root, ignore_errors=True)
    if errors:
        raise SandboxError("; ".join(errors))


def prerequisite_problem() -> str | None:
    """Why Docker sandboxes cannot run on this machine (with the fix), or None when a daemon
    answers."""
    from environments import sandboxes  # docker_available as the package has it

    if not sandboxes.docker_available():
        return "--sandbox docker: no Docker daemon answers (start dockerd, or use --sandbox bwrap)"
    return None


ENGINE = SandboxEngine(
    name="docker",
    title="Docker",
    capabilities=frozenset(CAPABILITIES),  # every one
    factory=DockerSandbox,
    prerequisites=prerequisite_problem,
)
