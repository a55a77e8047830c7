"""The Docker daemon as the sandboxes reach it: whether one answers, a client of it, a bounded
exec and an ended exec's status, and a sandbox's workspace disk served by it as a volume."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from environments.sandboxes import disk
from environments.sandboxes.capture import OutputCapture, read_docker_frames_until
from environments.sandboxes.protocol import AgentBrokeSandbox, SandboxError

EXEC_BOUNDED_BYTES = 4096
"""The most of an ``exec_bounded`` command's output kept."""

EXIT_WAIT_S = 10.0
"""How long an exec whose output has ended may still be reported running (over a second on a
loaded machine, where one second was once allowed)."""
LOCAL_DAEMON_URL = "http+docker://localhost"  # the SDK's base_url for a unix:// socket
API_TIMEOUT_S = 300


def docker_available() -> bool:
    """Whether the docker SDK is installed and a Docker daemon answers a ping."""
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def restart_failure(
    client: Any, container: Any, labels: dict[str, str], exc: Exception
) -> Exception:
    """What a sandbox's container failing to start again (``exc``) is: AgentBrokeSandbox where
    the daemon refused it for its root filesystem (a 4xx naming the rootfs) and a fresh
    container of its image starts as a sandbox's does (docker-init, no network; removed again
    at once), for then only the container's own files stop it, which only the agent changed
    (a root agent made the ``/sbin`` link of a merged-usr image a file, where the runtime
    mounts docker-init, and every restart failed: red team, 2026-12-07); else SandboxError,
    the daemon's failure (a timeout, a lost connection, a volume it cannot mount)."""
    why = f"container {container.name} could not be restarted: {exc}"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if not (isinstance(status, int) and 400 <= status < 500 and "rootfs" in str(exc)):
        return SandboxError(why)
    image = str(container.attrs.get("Image", ""))
    try:
        probe = client.containers.run(
            image, ["sleep", "0"], detach=True, init=True, network_mode="none", labels=labels
        )
    except Exception:
        return SandboxError(why)
    with contextlib.suppress(Exception):
        probe.remove(force=True)
    return AgentBrokeSandbox(f"{why} (a fresh container of its image starts)")


def daemon_client() -> Any:
    """A docker SDK client of the daemon that answered a ping (``DOCKER_HOST`` or the local
    socket), with the API timeout; ``SandboxError`` saying what is missing otherwise."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxError("the docker SDK is not installed: pip install docker") from exc
    try:
        client = docker.from_env(timeout=API_TIMEOUT_S)
        client.ping()
    except Exception as exc:
        raise SandboxError(f"no Docker daemon reachable (DOCKER_HOST / socket): {exc}") from exc
    return client


class HostFolders(Protocol):
    """Where a sandbox keeps what it must remove beside its container (``docker._HostDisk``)."""

    root: Path | None
    workspace: Path | None


def make_workspace_volume(
    client: Any,
    name: str,
    disk_mb: int | None,
    labels: dict[str, str],
    host: HostFolders,
    prefix: str,
) -> None:
    """A workspace disk of ``disk_mb`` (``disk.py``) served as the named volume ``name`` (the
    ``local`` driver's bind), its host folders noted in ``host`` as they are made (the caller
    removes them, and the volume, whatever fails); nothing, with a warning, where no disk can
    be made: no bound asked, a daemon not on this host, no root or loop devices."""
    if disk.validate_disk_mb(disk_mb) is None:
        return
    if getattr(client.api, "base_url", None) != LOCAL_DAEMON_URL:
        disk.warn_unbounded("the Docker daemon is not on this host (no unix:// socket)")
        return
    if not disk.available():
        disk.warn_unbounded("workspace disks need root, mkfs.ext4 and loop devices")
        return
    host.root = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    host.workspace = disk.create(host.root, disk_mb)
    options = {"type": "none", "o": "bind", "device": str(host.workspace)}
    try:
        client.volumes.create(name=name, driver="local", driver_opts=options, labels=labels)
    except Exception as exc:
        raise SandboxError(f"could not make the workspace volume {name}: {exc}") from exc


def exec_bounded(
    client: Any, container_id: str, argv: list[str], deadline: float
) -> tuple[str | None, str]:
    """Run ``argv`` in the container through the exec API: its exec id (None where it had not
    ended by ``deadline``) and at most ``EXEC_BOUNDED_BYTES`` of its output (undecodable
    bytes replaced). Bounded both ways, unlike ``exec_run``, as the program may be the
    agent's (root in a container): one that never ends or prints without end held the
    grading for ever (red team, 2026-12-07). The API's own failures are raised."""
    made = client.api.exec_create(container_id, argv, stdout=True)
    sock = client.api.exec_start(made["Id"], socket=True)
    capture = OutputCapture(EXEC_BOUNDED_BYTES)
    try:
        ended = read_docker_frames_until(sock, capture, deadline)
    finally:
        sock.close()
    return (made["Id"] if ended else None), capture.text()[0]


def exec_status(client: Any, exec_id: str, marker: str) -> tuple[int | None, bool]:
    """An exec's exit status once its output has ended (None: still reported running after
    ``EXIT_WAIT_S``), and whether it started (the runtime gave it a pid)."""
    deadline, pause = time.monotonic() + EXIT_WAIT_S, 0.01
    while True:
        try:
            info = client.api.exec_inspect(exec_id)
        except Exception as exc:
            raise SandboxError(f"container {marker}: exec lost: {exc}") from exc
        if not info.get("Running"):
            return info.get("ExitCode"), bool(info.get("Pid"))
        if time.monotonic() >= deadline:
            return None, True
        time.sleep(pause)
        pause = min(2 * pause, 0.2)
