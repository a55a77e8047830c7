"""A Harbor task's environment/docker-compose.yaml: the services that run beside ``main``.

Harbor runs a task's compose file over its own base file, whose ``main`` service is built from
environment/Dockerfile (or ``docker_image``) and is where the agent's commands and a shared
verifier run; the task's file adds services (a database, a server the agent reaches by name)
and may add to ``main`` (its ``environment``, ``depends_on``). Here the Docker sandbox makes
them through the SDK (``environments.sandboxes.compose``): this module reads the file (bounded,
as every task file), checks it, and turns each service into a ``ServiceSpec``, in ``depends_on``
order, with the task's ``cpus`` and ``memory_mb`` limits.

Supported per service: ``build`` (a context inside the task folder, its ``Dockerfile``),
``image`` (through the image aliases; nothing is pulled), ``command`` and ``entrypoint`` (a
list or a string), ``working_dir``, ``user``, ``environment`` (a mapping or ``KEY=VALUE``
list), ``depends_on`` (names, or conditions ``service_started`` / ``service_healthy``),
``healthcheck`` (``test``, ``interval``, ``timeout``, ``retries``, ``start_period``: a service
that has one is waited for until it passes, at most ``start_period + retries × (interval +
timeout)``). ``ports``, ``expose``, ``deploy`` and the keys that only name or restart a
container are ignored with a warning (``IGNORED_KEYS``). Refused, one line each: every other
key, among them what would open a route out or reach the host (``network_mode``,
``networks``, ``volumes``, ``privileged``, ``cap_add``, ``devices``, ``extra_hosts``…), and
top-level ``volumes`` and ``networks``; ``main`` may only add ``environment`` and
``depends_on`` (and restate Harbor's ``build``). Extension fields (``x-…``) are ignored, as
Compose ignores them.

``${VAR}`` in the file is interpolated as Compose does (``$VAR``, ``${VAR:-default}``,
``${VAR-default}``, ``${VAR:?error}``, ``$$``) from the task's ``[environment].env``, whose own
``${VAR:-default}`` values take their default: Harbor's compose process also sees the host's
environment, which is not read here, so a task runs the same on every machine. A variable
that is not set is empty, with a warning (Compose's rule).
"""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path
from typing import Any

from environments.sandboxes.protocol import ServiceSpec
from environments.tasks import TaskFormatError
from environments.terminal_bench import inputs, schema
from thundersync.protocol.documents import DocumentError, excerpt, load_yaml

COMPOSE_FILE = "docker-compose.yaml"
MAIN = "main"
SERVICE_KEYS = frozenset(
    {
        "build",
        "image",
        "command",
        "entrypoint",
        "working_dir",
        "user",
        "environment",
        "depends_on",
        "healthcheck",
    }
)
MAIN_KEYS = frozenset({"build", "environment", "depends_on"})
IGNORED_KEYS = frozenset(
    {
        "ports",
        "expose",
        "container_name",
        "hostname",
        "restart",
        "init",
        "pull_policy",
        "labels",
        "deploy",
        "platform",
        "tty",
        "stdin_open",
        "stop_signal",
        "stop_grace_period",
    }
)
"""Warned about and left out: nothing is published, every service reaches every other by name,
and the limits are the task's (``deploy`` too)."""
TOP_LEVEL = frozenset({"services", "version", "name"})
MAX_START_S = 600.0
"""The longest a service's healthcheck is waited for, whatever its file says."""
_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_VARIABLE = re.compile(
    r"\$\$|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<word>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def read_services(
    env_dir: Path,
    task_dir: Path,
    *,
    variables: dict[str, str],
    memory_mb: int,
    cpus: float,
) -> tuple[tuple[ServiceSpec, ...], dict[str, str]]:
    """The services of ``env_dir``'s compose file other than ``main``, in the order they start,
    and the environment the file adds to ``main``; ``variables`` (the task's env) are what
    ``${VAR}`` may name. TaskFormatError naming the field otherwise."""
    path = env_dir / COMPOSE_FILE
    values = {name: _interpolate(path, "<env>", value, {}) for name, value in variables.items()}
    data = _substitute(path, "", _load(path), values)
    for key in sorted(k for k in set(data) - TOP_LEVEL if not _extension(k)):
        raise TaskFormatError(
            path, key, f"not supported (expected only {', '.join(sorted(TOP_LEVEL))})"
        )
    services = schema.check_mapping(path, "services", data.get("services"))
    tables = {}
    for name, table in services.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise TaskFormatError(path, "services", f"expected a service name, got {excerpt(name)}")
        tables[name] = schema.check_mapping(path, f"services.{name}", table or {})
        _check_keys(path, name, tables[name])
    main = tables.pop(MAIN, {})
    _check_main_build(path, env_dir, main.get("build"))
    specs = {
        name: _service(path, env_dir, task_dir, name, table, memory_mb=memory_mb, cpus=cpus)
        for name, table in tables.items()
    }
    order = _start_order(path, {n: _depends_on(path, n, t) for n, t in tables.items()})
    _depends_on(path, MAIN, main)  # checked: main starts last, after them all
    for name in _depends_on(path, MAIN, main):
        if name not in specs:
            raise TaskFormatError(path, f"services.{MAIN}.depends_on", f"no service {name!r}")
    return tuple(specs[n] for n in order), _environment(path, MAIN, main.get("environment"))


def _load(path: Path) -> dict[str, Any]:
    try:
        data = load_yaml(
            schema.read_utf8(path, "<document>", limit=inputs.MAX_TASK_FILE_BYTES), path
        )
    except DocumentError as err:
        raise TaskFormatError(path, "<document>", err.problem) from None
    if not isinstance(data, dict):
        raise TaskFormatError(path, "<document>", f"expected a mapping, got {excerpt(data)}")
    return data


def _substitute(path: Path, field: str, value: Any, variables: dict[str, str]) -> Any:
    """``value`` with every string in it interpolated (keys are left as written)."""
    if isinstance(value, str):
        return _interpolate(path, field or "<document>", value, variables)
    if isinstance(value, dict):
        return {
            k: _substitute(path, f"{field}.{k}".lstrip("."), v, variables) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_substitute(path, f"{field}[{i}]", v, variables) for i, v in enumerate(value)]
    return value


def _interpolate(path: Path, field: str, text: str, variables: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("braced") or match.group("bare")
        operator, word = match.group("op") or "", match.group("word") or ""
        value = variables.get(name)
        unset = value is None or (operator.startswith(":") and value == "")
        if operator.endswith("?") and unset:
            raise TaskFormatError(path, field, f"${{{name}}}: {word or 'not set'}")
        if operator.endswith("-") and unset:
            return word
        if value is None:
            warnings.warn(f"{path}: field {field!r}: ${{{name}}} is not set, empty", stacklevel=2)
        return value or ""

    if "$" not in text:
        return text
    result = _VARIABLE.sub(replace, text)
    if _VARIABLE.sub("", text.replace("$$", "")).count("$"):
        raise TaskFormatError(path, field, f"a '$' that names no variable: {excerpt(text)}")
    return result


def _check_keys(path: Path, name: str, table: dict[str, Any]) -> None:
    allowed = MAIN_KEYS if name == MAIN else SERVICE_KEYS
    for key in sorted(k for k in set(table) - allowed if not _extension(k)):
        field = f"services.{name}.{key}"
        if key in IGNORED_KEYS:
            warnings.warn(f"{path}: field {field!r}: ignored here", UserWarning, stacklevel=4)
            continue
        why = "main is the sandbox: built from environment/Dockerfile (or docker_image)"
        if name != MAIN or key not in SERVICE_KEYS:
            why = "the services share one network with no route out, and reach no host path"
        raise TaskFormatError(path, field, f"not supported: {why}")


def _extension(key: object) -> bool:
    """Compose's extension fields (``x-…``, at the top or in a service) are for anchors and
    tools, ignored by Compose itself."""
    return isinstance(key, str) and key.startswith("x-")


def _check_main_build(path: Path, env_dir: Path, build: object) -> None:
    """``main``'s build may only restate Harbor's: environment/ and its Dockerfile."""
    if build is None:
        return
    context, dockerfile = _build(path, MAIN, build)
    if (env_dir / context).resolve() != env_dir.resolve() or dockerfile != "Dockerfile":
        raise TaskFormatError(
            path, f"services.{MAIN}.build", "expected environment/ and its Dockerfile"
        )


def _build(path: Path, name: str, build: object) -> tuple[str, str]:
    if isinstance(build, str):
        return build, "Dockerfile"
    table = schema.check_mapping(path, f"services.{name}.build", build)
    for key in sorted(set(table) - {"context", "dockerfile"}):
        raise TaskFormatError(path, f"services.{name}.build.{key}", "not supported")
    context, dockerfile = table.get("context", "."), table.get("dockerfile", "Dockerfile")
    if not isinstance(context, str) or not isinstance(dockerfile, str):
        raise TaskFormatError(path, f"services.{name}.build", f"expected paths, got {table}")
    return context, dockerfile


def _service(
    path: Path,
    env_dir: Path,
    task_dir: Path,
    name: str,
    table: dict[str, Any],
    *,
    memory_mb: int,
    cpus: float,
) -> ServiceSpec:
    image, context = table.get("image"), None
    if "build" in table:
        relative, dockerfile = _build(path, name, table["build"])
        field = f"services.{name}.build.context"
        context = inputs.inside(env_dir / relative, task_dir, field)
        if dockerfile != "Dockerfile":  # the image is built from the context's Dockerfile
            raise TaskFormatError(
                path,
                f"services.{name}.build.dockerfile",
                f"only the context's own Dockerfile is supported, got {excerpt(dockerfile)}",
            )
        if not (context / "Dockerfile").is_file():
            raise TaskFormatError(path, field, f"expected a folder with a Dockerfile: {relative}")
    elif not isinstance(image, str) or not image.strip():
        raise TaskFormatError(path, f"services.{name}", "expected a build context or an image")
    healthcheck, start_s = _healthcheck(path, name, table.get("healthcheck"))
    return ServiceSpec(
        name=name,
        image=None if context else image,
        build_context=context,
        command=_command(path, f"services.{name}.command", table.get("command")),
        entrypoint=_command(path, f"services.{name}.entrypoint", table.get("entrypoint")),
        working_dir=_optional_str(path, f"services.{name}.working_dir", table.get("working_dir")),
        user=_optional_str(path, f"services.{name}.user", table.get("user")),
        env=_environment(path, name, table.get("environment")),
        healthcheck=healthcheck,
        start_timeout_s=start_s,
        memory_mb=memory_mb,
        cpus=cpus,
    )


def _command(path: Path, field: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TaskFormatError(path, field, f"expected a command, got {excerpt(value)}")


def _optional_str(path: Path, field: str, value: object) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    if isinstance(value, int) and not isinstance(value, bool):  # user: 1000
        return str(value)
    raise TaskFormatError(path, field, f"expected a string, got {excerpt(value)}")


def _environment(path: Path, name: str, value: object) -> dict[str, str]:
    field = f"services.{name}.environment"
    if isinstance(value, list):
        pairs = [str(item).partition("=") for item in value]
        if any(not key or not sep for key, sep, _ in pairs):
            raise TaskFormatError(path, field, f"expected KEY=VALUE items, got {excerpt(value)}")
        return {key: val for key, _, val in pairs}
    table = schema.check_mapping(path, field, value or {})
    return {
        str(k): ("" if v is None else str(v).lower() if isinstance(v, bool) else str(v))
        for k, v in table.items()
    }


def _depends_on(path: Path, name: str, table: dict[str, Any]) -> list[str]:
    value, field = table.get("depends_on") or [], f"services.{name}.depends_on"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    for dep, spec in schema.check_mapping(path, field, value).items():
        condition = spec.get("condition", "service_started") if isinstance(spec, dict) else spec
        if condition not in ("service_started", "service_healthy"):
            raise TaskFormatError(
                path,
                f"{field}.{dep}.condition",
                f"expected service_started or service_healthy, got {excerpt(condition)}",
            )
    return [str(dep) for dep in value]


def _start_order(path: Path, deps: dict[str, list[str]]) -> list[str]:
    """The services in an order where each starts after what it depends on."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise TaskFormatError(path, f"services.{name}.depends_on", "a dependency cycle")
        visiting.add(name)
        for dep in deps[name]:
            if dep not in deps:
                raise TaskFormatError(path, f"services.{name}.depends_on", f"no service {dep!r}")
            visit(dep)
        order.append(name)

    for name in deps:
        visit(name)
    return order


def _healthcheck(path: Path, name: str, value: object) -> tuple[str | None, float]:
    """The healthcheck as a shell command and how long it may take to pass."""
    if value is None:
        return None, 30.0
    field = f"services.{name}.healthcheck"
    table = schema.check_mapping(path, field, value)
    test = table.get("test")
    if table.get("disable") or test == ["NONE"]:
        return None, 30.0
    if isinstance(test, str):
        command = test
    elif isinstance(test, list) and len(test) > 1 and test[0] in ("CMD", "CMD-SHELL"):
        command = test[1] if test[0] == "CMD-SHELL" else shlex.join(test[1:])
    else:
        raise TaskFormatError(path, f"{field}.test", f"expected a command, got {excerpt(test)}")
    seconds = {
        key: _duration(path, f"{field}.{key}", table.get(key), default)
        for key, default in (("interval", 30.0), ("timeout", 30.0), ("start_period", 0.0))
    }
    retries = table.get("retries", 3)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 1:
        raise TaskFormatError(path, f"{field}.retries", f"expected a count, got {retries!r}")
    wait = seconds["start_period"] + retries * (seconds["interval"] + seconds["timeout"])
    return command, min(wait, MAX_START_S)


def _duration(path: Path, field: str, value: object, default: float) -> float:
    if value is None:
        return default
    text = str(value)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise TaskFormatError(path, field, f"expected a duration like 1s or 500ms, got {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)
