"""A Docker sandbox's services (``SandboxSpec.services``): one network namespace with no way out.

A compose task's other containers (a database, a web server the agent talks to) run beside the
sandbox's own, made through the Docker SDK directly (no ``docker compose`` here). They share
one network namespace that has only a loopback interface: a small holder container made with
``network_mode="none"`` owns it, and every service and the sandbox's own container join it
(``network_mode="container:<holder>"``), so each reaches the others as ``localhost`` and, through
the holder's /etc/hosts, by its service name (``main`` for the sandbox's). Not a Docker network,
not even an ``internal`` one: this daemon runs with ``--iptables=false``, where an internal
bridge network still routes to the host's bridge address, so a service could reach every port
the host listens on. Harbor itself puts the services of a task without ``public`` network into
one shared namespace (its egress sidecar's); the cost is the same as there: two services may
not listen on the same port.

Services start in the order given (the loader sorts ``depends_on``); one with a healthcheck is
waited for until it passes, at most its ``start_timeout_s``. A service that exits or never turns
healthy is a SandboxError (the task's infrastructure failure) with its last log lines, never a
hang. Every container carries the sandbox's labels (``thundersync.owner_pid``…), so a run killed
before it could remove them has them reaped by the next (``orphans.py``); ``remove`` takes them
away on every other path out, after the sandbox's own container, the holder last.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from environments.sandboxes.image_build import (
    LABEL,
    LOCAL_BASE_IMAGE,
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
    """What was made so far (filled in as it is made, so a failure half-way removes it all):
    the holder of the network namespace, then the services' containers."""

    holder: str | None = None
    containers: list[str] = field(default_factory=list)


def start(
    client: Any, made: Services, specs: tuple[ServiceSpec, ...], marker: str, labels: dict[str, str]
) -> str:
    """Make the namespace's holder and start ``specs`` in order in its namespace; returns the
    ``network_mode`` that puts the sandbox's own container there too."""
    name = f"{marker}-net"
    hosts = {spec.name: "127.0.0.1" for spec in specs} | {"main": "127.0.0.1"}
    try:
        client.containers.run(
            LOCAL_BASE_IMAGE,
            command=["sleep", "infinity"],
            name=name,
            detach=True,
            network_mode="none",
            extra_hosts=hosts,
            init=True,
            mem_limit="32m",
            pids_limit=8,
            labels={**labels, f"{LABEL}.service": "network"},
        )
    except Exception as exc:
        if _exists(client, name):
            made.holder = name
        raise SandboxError(f"could not make the services' network holder {name}: {exc}") from exc
    made.holder = name
    for spec in specs:
        _start_one(client, made, spec, marker, labels)
    return f"container:{name}"


def is_services_network(network: str) -> bool:
    """Whether ``network`` is what ``start`` returns (never ``host`` or a bridge: a spec's
    ``network`` may only join a holder's namespace, which has no way out)."""
    return re.fullmatch(r"container:thundersync-[0-9a-f]{12}-net", network) is not None


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
    try:
        client.containers.run(
            image,
            command=list(spec.command) if spec.command is not None else None,
            entrypoint=list(spec.entrypoint) if spec.entrypoint is not None else None,
            working_dir=spec.working_dir,
            user=spec.user,
            name=container_name,
            detach=True,
            network_mode=f"container:{made.holder}",
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
    """Remove the services' containers, then the holder; returns what could not go."""
    errors = []
    for name in [*reversed(made.containers), *([made.holder] if made.holder else [])]:
        try:
            client.containers.get(name).remove(force=True)
        except Exception as exc:
            if type(exc).__name__ != "NotFound":
                errors.append(f"could not remove service container {name}: {exc}")
    made.containers.clear()
    made.holder = None
    return errors
