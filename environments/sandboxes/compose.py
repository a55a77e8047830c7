"""A Docker sandbox's services (``SandboxSpec.services``): an internal network, a container each.

A compose task's other containers (a database, a web server the agent talks to) run beside the
sandbox's own, made through the Docker SDK directly (no ``docker compose`` here): one network of
the sandbox's own, ``internal`` (Docker gives it no gateway, so nothing on it has a route out of
the machine), each service on it under its name, started in the order given (the loader sorts
``depends_on``) and, where it has a healthcheck, waited for until it passes, at most its
``start_timeout_s``. A service that exits or never turns healthy is a SandboxError (the task's
infrastructure failure) with its last log lines, never a hang. Every container and the network
carry the sandbox's labels (``thundersync.owner_pid``…), so a run killed before it could remove
them has them reaped by the next (``orphans.py``); ``remove`` takes them away on every other
path out, the sandbox's own container first (a network with a container on it cannot go).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from environments.sandboxes.image_build import (
    LABEL,
    build_image,
    require_local_image,
    resolve_image,
)
from environments.sandboxes.protocol import MAX_FILE_BYTES, SandboxError, ServiceSpec

LOG_LINES = 20
"""How many of a failed service's last log lines its SandboxError quotes."""
POLL_S = 0.25
"""How often a starting service's state and healthcheck are looked at."""
HEALTHCHECK_TIMEOUT_S = 10
"""One healthcheck command's limit (``timeout`` in the service's container)."""


@dataclass(slots=True)
class Services:
    """What was made so far (filled in as it is made, so a failure half-way removes it all)."""

    network: str | None = None
    containers: list[str] = field(default_factory=list)


def start(
    client: Any, made: Services, specs: tuple[ServiceSpec, ...], marker: str, labels: dict[str, str]
) -> str:
    """Make the network and start ``specs`` in order on it; returns the network's name."""
    name = f"{marker}-net"
    try:
        client.networks.create(name, driver="bridge", internal=True, labels=labels)
    except Exception as exc:
        raise SandboxError(f"could not make the services' network {name}: {exc}") from exc
    made.network = name
    for spec in specs:
        _start_one(client, made, spec, marker, labels)
    return name


def endpoint(client: Any, network: str, alias: str) -> dict[str, Any]:
    """``networking_config`` for a container on ``network`` reached as ``alias``."""
    return {network: client.api.create_endpoint_config(aliases=[alias])}


def _image(client: Any, spec: ServiceSpec) -> str:
    if spec.build_context is not None:
        return build_image(client, spec.build_context)
    if spec.image is None:
        raise SandboxError(f"service {spec.name}: neither a build context nor an image")
    local = resolve_image(spec.image)
    require_local_image(client, spec.image, local)
    return local


def _start_one(
    client: Any, made: Services, spec: ServiceSpec, marker: str, labels: dict[str, str]
) -> None:
    import docker.types  # the SDK is there: a client was made

    image, container_name = _image(client, spec), f"{marker}-{spec.name}"
    network = made.network or ""
    try:
        client.containers.run(
            image,
            command=list(spec.command) if spec.command is not None else None,
            name=container_name,
            hostname=spec.name,
            detach=True,
            network=network,
            networking_config=endpoint(client, network, spec.name),
            init=True,
            mem_limit=f"{spec.memory_mb}m",
            memswap_limit=f"{spec.memory_mb}m",
            nano_cpus=int(spec.cpus * 1e9),
            pids_limit=spec.pids,
            ulimits=[docker.types.Ulimit(name="fsize", soft=MAX_FILE_BYTES, hard=MAX_FILE_BYTES)],
            environment=dict(spec.env),
            labels={**labels, f"{LABEL}.service": spec.name},
            auto_remove=False,
        )
    except Exception as exc:
        if _exists(client, container_name):  # made, then refused to start
            made.containers.append(container_name)
        raise SandboxError(f"service {spec.name}: could not start from {image!r}: {exc}") from exc
    made.containers.append(container_name)
    wait_ready(client, container_name, spec)


def _exists(client: Any, name: str) -> bool:
    try:
        client.containers.get(name)
    except Exception:
        return False
    return True


def wait_ready(client: Any, name: str, spec: ServiceSpec) -> None:
    """Return once service ``spec`` runs (and its healthcheck passed, if it has one); a
    SandboxError with its last log lines when it exits first or its time runs out."""
    container = client.containers.get(name)
    deadline = time.monotonic() + spec.start_timeout_s
    last = ""
    while True:
        container.reload()
        if container.status not in ("created", "running"):
            code = container.attrs.get("State", {}).get("ExitCode")
            raise _failed(container, spec, f"it exited (code {code}) while starting")
        if container.status == "running":
            if spec.healthcheck is None:
                return
            code, out = container.exec_run(
                ["timeout", str(HEALTHCHECK_TIMEOUT_S), "sh", "-c", spec.healthcheck]
            )
            if code == 0:
                return
            last = out.decode("utf-8", "replace").strip()[-300:]
        if time.monotonic() >= deadline:
            why = f"not ready after {spec.start_timeout_s:g} s"
            if spec.healthcheck is not None:
                why += f" (healthcheck `{spec.healthcheck}` still fails: {last or 'no output'})"
            raise _failed(container, spec, why)
        time.sleep(POLL_S)


def check_running(client: Any, made: Services, specs: tuple[ServiceSpec, ...]) -> None:
    """SandboxError when a service has exited since it started (checked once all run)."""
    for name, spec in zip(made.containers, specs, strict=False):
        container = client.containers.get(name)
        container.reload()
        if container.status != "running":
            code = container.attrs.get("State", {}).get("ExitCode")
            raise _failed(container, spec, f"it exited (code {code}) after it started")


def _failed(container: Any, spec: ServiceSpec, why: str) -> SandboxError:
    try:
        logs = container.logs(tail=LOG_LINES).decode("utf-8", "replace").rstrip()
    except Exception as exc:
        logs = f"(its logs cannot be read: {exc})"
    return SandboxError(
        f"service {spec.name} failed to start: {why}; its last log lines:\n{logs or '(none)'}"
    )


def remove(client: Any, made: Services) -> list[str]:
    """Remove the services' containers, then their network; returns what could not go."""
    errors = []
    for name in reversed(made.containers):
        try:
            client.containers.get(name).remove(force=True)
        except Exception as exc:
            if type(exc).__name__ != "NotFound":
                errors.append(f"could not remove service container {name}: {exc}")
    made.containers.clear()
    if made.network is not None:
        try:
            client.networks.get(made.network).remove()
        except Exception as exc:
            if type(exc).__name__ != "NotFound":
                errors.append(f"could not remove network {made.network}: {exc}")
        made.network = None
    return errors
