"""Loads a Harbor (Terminal-Bench 2+) task folder: task.toml, instruction.md, environment/."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from environments.sandboxes.disk import MIN_DISK_MB
from environments.sandboxes.host_view import SYSTEM_DIRS
from environments.sandboxes.protocol import ServiceSpec
from environments.tasks import TaskFormatError
from environments.terminal_bench import collection, compose_task, inputs, schema, users
from environments.terminal_bench import steps as harbor_steps
from environments.terminal_bench.dockerfile import DEFAULT_WORKDIR, DockerfilePlan, read_dockerfile
from environments.terminal_bench.environment import TaskEnvironment
from environments.terminal_bench.network import read_network_policy
from environments.terminal_bench.task import TerminalBenchTask
from environments.terminal_bench.verifier import read_verifier_environment
from thundersync.protocol.documents import DocumentError, excerpt, load_toml

DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0
SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
"""The task.toml schema versions Harbor has published (harbor 0.1 wrote ``version = "1.0"``,
0.3 ``schema_version = "1.1"``, 0.6 "1.2", 0.13 "1.3", 0.24 to 0.26 "1.4"); another version may
mean fields this loader does not implement, so it is refused."""
TOP_LEVEL = frozenset(
    {
        "version",
        "schema_version",
        "source",
        "task",
        "metadata",
        "verifier",
        "agent",
        "environment",
        "solution",
        "steps",
        "multi_step_reward_strategy",
        "artifacts",
    }
)
"""Unknown top-level keys are errors (a misspelt ``[verifer]`` would silently keep defaults);
unknown keys inside the known tables only warn, since Harbor keeps adding optional ones."""
_TABLE_KEYS = {
    "task": frozenset({"name", "version", "description", "authors", "keywords"}),
    "verifier": frozenset(
        {
            "timeout_sec",
            "env",
            "user",
            "environment_mode",
            "environment",
            "reward_key",
            "network_mode",
            "allowed_hosts",
            "collect",
        }
    ),
    "agent": frozenset({"timeout_sec", "user", "network_mode", "allowed_hosts"}),
    "solution": frozenset({"env"}),
    "environment": frozenset(
        {
            "build_timeout_sec",
            "docker_image",
            "cpus",
            "memory",
            "memory_mb",
            "storage",
            "storage_mb",
            "gpus",
            "gpu_types",
            "allow_internet",
            "env",
            "workdir",
            "os",
            "mcp_servers",
            "skills_dir",
            "healthcheck",
            "network_mode",
            "allowed_hosts",
        }
    ),
}
_TASK_NAME = re.compile(r"([a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*", re.IGNORECASE)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return load_toml(schema.read_utf8(path, "<document>"), path)
    except DocumentError as err:
        raise TaskFormatError(path, "<document>", err.problem) from None


def _tables(path: Path, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    schema.check_keys(path, data, TOP_LEVEL, strict=True)
    for key in ("version", "schema_version"):
        if data.get(key, "1.0") not in SCHEMA_VERSIONS:
            raise TaskFormatError(
                path,
                key,
                f"expected one of Harbor's schema versions {', '.join(SCHEMA_VERSIONS)} "
                f"(a string), got {excerpt(data[key])}",
            )
    tables = {
        name: schema.check_mapping(path, name, data.get(name, {}))
        for name in ("task", "metadata", "verifier", "agent", "environment", "solution")
    }
    for name, known in _TABLE_KEYS.items():
        schema.check_keys(path, tables[name], known, prefix=f"{name}.", strict=False)
    task_name = tables["task"].get("name")
    if task_name is not None and (
        not isinstance(task_name, str) or not _TASK_NAME.fullmatch(task_name) or ".." in task_name
    ):
        raise TaskFormatError(
            path,
            "task.name",
            f"expected 'name' or 'org/name' without path parts, got {excerpt(task_name)}",
        )
    return tables


def _package(path: Path, table: dict[str, Any]) -> dict[str, Any]:
    """``[task]`` (Harbor's ``PackageInfo``: the task's published name and version), kept in
    the task's metadata as ``package``."""
    version = table.get("version")
    if version is not None and (not isinstance(version, str) or not version.strip()):
        raise TaskFormatError(path, "task.version", f"expected a version, got {excerpt(version)}")
    authors = table.get("authors", [])
    if not isinstance(authors, list) or not all(
        isinstance(a, dict) and isinstance(a.get("name"), str) for a in authors
    ):
        raise TaskFormatError(
            path, "task.authors", f"expected [{{name, email}}] tables, got {excerpt(authors)}"
        )
    return {
        "name": table.get("name"),
        "version": version,
        "description": schema.read_optional_str(
            path, "task.description", table.get("description"), ""
        ),
        "authors": [{k: str(v) for k, v in a.items()} for a in authors],
        "keywords": list(schema.read_tags(path, "task.keywords", table.get("keywords"))),
    }


def _schema_14(
    path: Path, data: dict[str, Any], tables: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The task-level keys of schema 1.4 beyond one sandbox's instruction and tests:
    ``[environment.healthcheck]``, ``artifacts`` and ``[[verifier.collect]]`` (the task's
    fields of the same names); ``[[environment.mcp_servers]]`` is refused."""
    if tables["environment"].get("mcp_servers"):
        raise TaskFormatError(
            path,
            "environment.mcp_servers",
            "MCP servers are not supported here (no agent of ThunderSync speaks MCP): "
            "remove them to run the task without",
        )
    return {
        "healthcheck": harbor_steps.read_healthcheck(
            path, "environment.healthcheck", tables["environment"].get("healthcheck")
        ),
        "artifacts": collection.read_artifacts(path, "artifacts", data.get("artifacts")),
        "collect": collection.read_hooks(
            path, "verifier.collect", tables["verifier"].get("collect")
        ),
        "agent_user": users.read_user(path, "agent.user", tables["agent"].get("user")),
        "verifier_user": users.read_user(path, "verifier.user", tables["verifier"].get("user")),
    }


def _metadata(path: Path, table: dict[str, Any], package: dict[str, Any]) -> dict[str, Any]:
    return {
        **({"package": _package(path, package)} if package else {}),
        **table,
        "difficulty": schema.read_difficulty(path, "metadata.difficulty", table.get("difficulty")),
        "category": schema.read_optional_str(
            path, "metadata.category", table.get("category"), "general"
        ),
        "tags": schema.read_tags(path, "metadata.tags", table.get("tags")),
        "output_checked": schema.read_bool(
            path, "metadata.output_checked", table.get("output_checked"), False
        ),
    }


def _check_workdir(path: Path, workdir: str) -> str:
    """An absolute folder other than / outside the system folders (bubblewrap's rule that does
    not depend on the host; TaskEnvironment refuses bubblewrap for the rest)."""
    norm = posixpath.normpath(workdir)
    in_system = any(norm == d or norm.startswith(d + "/") for d in SYSTEM_DIRS)
    if not workdir.startswith("/") or norm == "/" or in_system:
        raise TaskFormatError(
            path,
            "environment.workdir",
            f"expected an absolute path other than / outside {', '.join(SYSTEM_DIRS)}, "
            f"got {excerpt(workdir)}",
        )
    return norm


def _environment(task_dir: Path, task_id: str, table: dict[str, Any]) -> TaskEnvironment:
    path = task_dir / "task.toml"
    env_dir = task_dir / "environment"
    image = table.get("docker_image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise TaskFormatError(
            path, "environment.docker_image", f"expected an image, got {excerpt(image)}"
        )
    memory_mb = schema.read_memory_mb(path, "environment.memory", table.get("memory"))
    if "memory_mb" in table:
        memory_mb = schema.read_memory_number(path, "environment.memory_mb", table["memory_mb"])
    plan: DockerfilePlan | None = None
    if image is None:
        if not env_dir.is_dir():
            raise TaskFormatError(task_dir, "environment", "expected an environment/ folder")
        plan = read_dockerfile(env_dir / "Dockerfile", env_dir)
    cpus = schema.read_positive(
        path, "environment.cpus", table.get("cpus"), 1.0, maximum=schema.MAX_CPUS
    )
    env = schema.read_env(path, "environment.env", table.get("env"))
    storage_mb = schema.read_memory_mb(path, "environment.storage", table.get("storage"))
    if "storage_mb" in table:
        storage_mb = schema.read_memory_number(path, "environment.storage_mb", table["storage_mb"])
    services: tuple[ServiceSpec, ...] = ()
    main_env: dict[str, str] = {}
    if (env_dir / compose_task.COMPOSE_FILE).is_file():  # a multi-container task
        services, main_env = compose_task.read_services(
            env_dir, task_dir, variables=env, memory_mb=memory_mb or 2048, cpus=cpus
        )
    workdir = schema.read_optional_str(
        path, "environment.workdir", table.get("workdir"), plan.workdir if plan else DEFAULT_WORKDIR
    )
    if "workdir" in table:
        workdir = _check_workdir(path, workdir)
    return TaskEnvironment(
        task_id=task_id,
        workdir=workdir,
        build_context=env_dir if plan else None,
        plan=plan,
        image=image,
        memory_mb=memory_mb or 2048,
        cpus=cpus,
        build_timeout_s=schema.read_timeout(
            path,
            "environment.build_timeout_sec",
            table.get("build_timeout_sec"),
            DEFAULT_BUILD_TIMEOUT_S,
        ),
        env={**main_env, **env},
        services=services,
        disk_mb=None if storage_mb is None else max(storage_mb, MIN_DISK_MB),
    )


def _instruction(task_dir: Path) -> str:
    path = task_dir / "instruction.md"
    if not path.is_file():
        raise TaskFormatError(task_dir, "instruction.md", "expected an instruction.md file")
    text = schema.read_utf8(path, "instruction", limit=inputs.MAX_INSTRUCTION_BYTES)
    return schema.read_instruction(path, "instruction", text)


def load_harbor_task(task_dir: Path, *, max_turns: int = 50) -> TerminalBenchTask:
    """Read and validate one Harbor task folder."""
    task_id = schema.check_task_id(task_dir)
    inputs.check_task_folder(task_dir)
    path = task_dir / "task.toml"
    data = _read_toml(path)
    tables = _tables(path, data)
    if "steps" in data:
        return _load_multi_step(task_dir, task_id, data, tables, max_turns=max_turns)
    # Harbor's TaskConfig checks the strategy whether or not there are steps
    harbor_steps.read_strategy(path, data.get("multi_step_reward_strategy"))
    instruction = _instruction(task_dir)
    agent_timeout = schema.read_timeout(
        path, "agent.timeout_sec", tables["agent"].get("timeout_sec"), DEFAULT_AGENT_TIMEOUT_S
    )
    test_timeout = schema.read_timeout(
        path,
        "verifier.timeout_sec",
        tables["verifier"].get("timeout_sec"),
        DEFAULT_VERIFIER_TIMEOUT_S,
    )
    tests_dir = task_dir / "tests"
    if not tests_dir.is_dir():
        raise TaskFormatError(task_dir, "tests", "expected a tests/ folder")
    if not (tests_dir / "test.sh").is_file():
        raise TaskFormatError(tests_dir, "test.sh", "expected tests/test.sh, the verifier")
    solve = task_dir / "solution" / "solve.sh"
    if not solve.is_file():
        raise TaskFormatError(task_dir, "solution/solve.sh", "expected the reference solution")
    environment = _environment(task_dir, task_id, tables["environment"])
    reward_key = tables["verifier"].get("reward_key")
    if reward_key is not None and (not isinstance(reward_key, str) or not reward_key):
        raise TaskFormatError(
            path, "verifier.reward_key", f"expected a metric name, got {excerpt(reward_key)}"
        )
    return TerminalBenchTask(
        **_schema_14(path, data, tables),
        task_id=task_id,
        instruction=instruction.strip() + "\n",
        path=task_dir,
        format="harbor",
        environment=environment,
        verifier=read_verifier_environment(task_dir, tables["verifier"], environment),
        reward_key=reward_key,
        tests_dir=tests_dir,
        test_script=tests_dir / "test.sh",
        test_timeout_s=test_timeout,
        solution_script=solve,
        solution_env=schema.read_env(path, "solution.env", tables["solution"].get("env")),
        test_env=schema.read_env(path, "verifier.env", tables["verifier"].get("env")),
        timeout_s=agent_timeout,
        max_turns=max_turns,
        metadata=_metadata(path, tables["metadata"], tables["task"]),
        network=read_network_policy(path, tables),
    )


def _load_multi_step(
    task_dir: Path,
    task_id: str,
    data: dict[str, Any],
    tables: dict[str, dict[str, Any]],
    *,
    max_turns: int,
) -> TerminalBenchTask:
    """A task with ``[[steps]]`` (``environments.terminal_bench.steps``): the root
    instruction.md is not read (Harbor's rule); each step has its own instruction, tests (or
    the task's tests/test.sh) and solution (or the task's solution/solve.sh)."""
    path = task_dir / "task.toml"
    environment = _environment(task_dir, task_id, tables["environment"])
    agent_timeout = schema.read_timeout(
        path, "agent.timeout_sec", tables["agent"].get("timeout_sec"), DEFAULT_AGENT_TIMEOUT_S
    )
    reward_key = tables["verifier"].get("reward_key")
    if reward_key is not None and (not isinstance(reward_key, str) or not reward_key):
        raise TaskFormatError(
            path, "verifier.reward_key", f"expected a metric name, got {excerpt(reward_key)}"
        )
    strategy = harbor_steps.read_strategy(path, data.get("multi_step_reward_strategy"))
    steps = harbor_steps.read_steps(
        task_dir, data["steps"], tables, environment, agent_timeout_s=agent_timeout
    )
    first = steps[0]
    return TerminalBenchTask(
        **_schema_14(path, data, tables),
        task_id=task_id,
        instruction=first.instruction,
        path=task_dir,
        format="harbor",
        environment=environment,
        verifier=first.verifier,
        tests_dir=first.tests_dir,
        test_script=first.test_script,
        test_timeout_s=first.test_timeout_s,
        solution_script=first.solution_script,
        solution_env=schema.read_env(path, "solution.env", tables["solution"].get("env")),
        test_env=first.test_env,
        timeout_s=first.timeout_s,
        max_turns=max_turns,
        metadata=_metadata(path, tables["metadata"], tables["task"]),
        network=read_network_policy(path, tables),
        reward_key=reward_key,
        steps=steps,
        reward_strategy=strategy,
    )
