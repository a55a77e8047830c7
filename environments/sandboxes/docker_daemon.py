"""The Docker daemon as the sandboxes reach it: whether one answers, and a client of it."""

from __future__ import annotations

from typing import Any

from environments.sandboxes.protocol import SandboxError

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
