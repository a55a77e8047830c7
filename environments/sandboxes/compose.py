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
hang; one that exits by itself once the episode is under way is the agent's failure
(``check_running``). Every container carries the sandbox's labels (``thundersync.owner_pid``…),
so a run killed before it could remove them has them reaped by the next (``orphans.py``);
``remove`` takes them away on every other path out, after the sandbox's own container, the
holder last.
"""

from __future__ import annotations

import math
import posixpath
import re
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from environments.sandboxes import docker_archive
from environments.sandboxes.image_build import (
    LABEL,
    LOCAL_BASE_IMAGE,
    build_image,
    require_local_image,
    resolve_image,
)
from environments.sandboxes.protocol import (
    DEFAULT_MAX_OUTPUT_BYTES,
    MAX_FILE_BYTES,
    AgentBrokeSandbox,
    ExecResult,
    SandboxError,
    ServiceSpec,
    truncate_output,
)

LOG_LINES = 20
"""How many of a failed service's last log lines its SandboxError quotes."""
LOG_CHARS = 4000
"""At most this much of those lines (their end): a service may log one very long line."""
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
    import docker.errors  # the SDK is there: a client was made

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
            try:
                code, out = container.exec_run(
                    ["timeout", str(HEALTHCHECK_TIMEOUT_S), "sh", "-c", spec.healthcheck]
                )
            except docker.errors.APIError as exc:  # it exited since the reload: the next says so
                code, out = None, str(exc).encode()
            if code == 0:
                return
            last = out.decode("utf-8", "replace").strip()[-300:]
        if time.monotonic() >= deadline:
            why = f"not ready after {spec.start_timeout_s:g} s"
            if spec.healthcheck is not None:
                why += f" (healthcheck `{spec.healthcheck}` still fails: {last or 'no output'})"
            raise _failed(container, spec, why)
        time.sleep(POLL_S)


def check_running(
    client: Any,
    made: Services,
    specs: tuple[ServiceSpec, ...],
    *,
    started: bool = False,
    until: float | None = None,
) -> None:
    """SandboxError with its last log lines when a service has exited since it started, or
    with ``started`` (the episode under way, not the sandbox being made) when the daemon says
    it failed to keep it running (``State.Error``) or its container is gone. A service that
    exited by itself during the episode is ``AgentBrokeSandbox``: the agent's requests reach
    it, and one it crashed would otherwise turn the agent's failure into an episode excluded
    from training; it scores 0, as Harbor's verifier scores a task whose service is down
    (docs/design.md §6). A service with a bug that valid requests hit fails the oracle's
    check (``verify``) instead. With ``until`` (a ``time.time()``), only a service that
    stopped before it counts: one that stopped later, while the verifier ran, was seen by the
    verifier, whose result stands."""
    for name, spec in zip(made.containers, specs, strict=False):
        try:
            container = client.containers.get(name)
            container.reload()
        except Exception as exc:
            raise SandboxError(f"service {spec.name}: its container is gone: {exc}") from exc
        if container.status != "running":
            state = container.attrs.get("State", {})
            if until is not None and _stopped_at(state) >= until:
                continue
            code = state.get("ExitCode")
            if not started:
                raise _failed(container, spec, f"it exited (code {code}) after it started")
            if state.get("Error"):  # the daemon could not keep it running
                why = f"the container engine stopped it during the episode: {state['Error']}"
                raise _failed(container, spec, why, verb="stopped")
            # the agent's requests reached it: the agent's failure, not infra
            why = f"it exited (code {code}) during the episode"
            raise _failed(container, spec, why, verb="stopped", error=AgentBrokeSandbox)


def _stopped_at(state: dict[str, Any]) -> float:
    """When the daemon says a container stopped (``State.FinishedAt``, RFC 3339 with
    nanoseconds), as a ``time.time()``; -inf where it does not say."""
    stamp = str(state.get("FinishedAt") or "")
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", stamp)
    if match is None:
        return -math.inf
    whole, fraction, zone = match.groups()
    at = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    return at.timestamp() + float(f"0.{fraction or 0}")


def _failed(
    container: Any,
    spec: ServiceSpec,
    why: str,
    *,
    verb: str = "failed to start",
    error: type[Exception] = SandboxError,
) -> Exception:
    try:
        logs = container.logs(tail=LOG_LINES).decode("utf-8", "replace").rstrip()
    except Exception as exc:
        logs = f"(its logs cannot be read: {exc})"
    if len(logs) > LOG_CHARS:
        logs = "[...]" + logs[-LOG_CHARS:]
    return error(f"service {spec.name} {verb}: {why}; its last log lines:\n{logs or '(none)'}")


class ServiceSandbox:
    """A running service's container, as far as Harbor's collection phase reaches a sidecar
    (``[[verifier.collect]]`` hooks and ``artifacts`` with ``service = "<name>"``): ``execute``
    runs ``sh -c`` as the image's user from ``/`` (Harbor's sidecar exec: no workdir, user or
    env of the task), killed after ``timeout`` s by the image's ``timeout`` where it has one,
    and never waited for longer than that plus ``GRACE_S``; ``download`` and ``export_folder``
    go through the daemon's archive API (no program of the container takes part). Nothing is
    uploaded to a service. It lives as long as the sandbox that made it."""

    GRACE_S = 10.0

    def __init__(self, client: Any, container_name: str, marker: str) -> None:
        self.workdir = "/"
        self.exec_user: str | None = None  # a hook's ``user`` (``exec -u``); None: the image's
        self._client = client
        self._name = container_name
        self._marker = marker

    def _container(self) -> Any:
        try:
            return self._client.containers.get(self._name)
        except Exception as exc:
            raise SandboxError(f"service container {self._name}: {exc}") from exc

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        container = self._container()
        seconds = str(max(1, int(timeout)))
        wrapper = (
            'if command -v timeout >/dev/null 2>&1; then exec timeout -s KILL "$0" sh -c "$1"; '
            'fi; exec sh -c "$1"'
        )
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["result"] = container.exec_run(
                    ["sh", "-c", wrapper, seconds, cmd], user=self.exec_user or ""
                )
            except Exception as exc:
                box["error"] = exc

        start = time.monotonic()
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout + self.GRACE_S)
        duration = time.monotonic() - start
        if worker.is_alive():
            return ExecResult("", None, True, duration)
        if "error" in box:
            raise SandboxError(f"service container {self._name}: exec failed: {box['error']}")
        code, raw = box["result"]
        output, truncated = truncate_output(raw or b"", DEFAULT_MAX_OUTPUT_BYTES)
        if code == 137 and duration >= timeout:
            return ExecResult(output, None, True, duration, truncated)
        return ExecResult(output, code, False, duration, truncated)

    def upload(self, src: Path, dst: str) -> None:
        raise SandboxError(f"service container {self._name}: nothing is uploaded to a service")

    def download(self, src: str, dst: Path) -> None:
        path = posixpath.normpath(posixpath.join("/", src))
        docker_archive.get(self._container(), self._marker, path, Path(dst))

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        full = posixpath.normpath(posixpath.join("/", path))
        container = self._container()
        docker_archive.export(self._client, container, self._marker, full, Path(dst), exclude)

    def stop_processes(self) -> None:
        """Nothing: a service keeps running until its sandbox is closed."""

    def close(self) -> None:
        """Nothing: the sandbox that made it removes the container."""


def service_sandbox(
    client: Any, made: Services | None, name: str, marker: str
) -> ServiceSandbox | None:
    """Service ``name`` of ``made`` (None when there is no such service)."""
    container_name = f"{marker}-{name}"
    if made is None or container_name not in made.containers:
        return None
    return ServiceSandbox(client, container_name, marker)


def check_alive(
    client: Any,
    made: Services | None,
    specs: tuple[ServiceSpec, ...],
    *,
    until: float | None = None,
) -> None:
    """Before grading (``stop_processes``) and after its verifier: a service that died during
    the episode is an error quoting its last log lines, never the grade of a verifier that
    could not reach it: the agent's failure where it exited by itself (``check_running``)."""
    if made is not None:
        check_running(client, made, specs, started=True, until=until)


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
