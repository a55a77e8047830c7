"""Loads a Terminal-Bench 1 task folder: task.yaml, Dockerfile or docker-compose.yaml, tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from environments.tasks import TaskFormatError
from environments.terminal_bench import inputs, schema
from environments.terminal_bench.dockerfile import read_dockerfile
from environments.terminal_bench.environment import TaskEnvironment
from environments.terminal_bench.task import TerminalBenchTask
from thundersync.protocol.documents import DocumentError, excerpt, load_yaml

DEFAULT_AGENT_TIMEOUT_S = 360.0
DEFAULT_TEST_TIMEOUT_S = 60.0
KNOWN_KEYS = frozenset(
    {
        "instruction",
        "descriptions",
        "author_name",
        "author_email",
        "difficulty",
        "category",
        "tags",
        "parser_name",
        "max_agent_timeout_sec",
        "max_test_timeout_sec",
        "test_scripts",
        "run_tests_in_same_shell",
        "env_name",
        "estimated_duration_sec",
        "expert_time_estimate_min",
        "junior_time_estimate_min",
        "disable_asciinema",
    }
)
"""Terminal-Bench 1's task.yaml schema; any other key is a typo and an error."""


def _load_yaml(path: Path) -> Any:
    """A task folder's YAML file, read bounded (size, depth, alias expansion)."""
    try:
        return load_yaml(schema.read_utf8(path, "<document>"), path)
    except DocumentError as err:
        raise TaskFormatError(path, "<document>", err.problem) from None


def _read_yaml(path: Path) -> dict[str, Any]:
    data = _load_yaml(path)
    if not isinstance(data, dict):
        raise TaskFormatError(path, "<document>", f"expected a mapping, got {type(data).__name__}")
    return data


def _instruction(path: Path, data: dict[str, Any]) -> str:
    """``instruction``, or the ``base`` entry of the older ``descriptions`` list."""
    if "instruction" in data or "descriptions" not in data:
        if "instruction" not in data:
            raise TaskFormatError(path, "instruction", "expected the task's instruction, missing")
        return schema.read_instruction(path, "instruction", data["instruction"])
    entries = data["descriptions"]
    if not isinstance(entries, list):
        raise TaskFormatError(path, "descriptions", f"expected a list, got {excerpt(entries)}")
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and entry.get("key") == "base":
            return schema.read_instruction(
                path, f"descriptions[{i}].description", entry.get("description")
            )
    raise TaskFormatError(path, "descriptions", "expected an entry with key 'base'")


def _solution(task_dir: Path) -> tuple[Path | None, tuple[str, ...]]:
    script, listing = task_dir / "solution.sh", task_dir / "solution.yaml"
    if script.is_file():
        return script, ()
    if not listing.is_file():
        raise TaskFormatError(task_dir, "solution.sh", "expected solution.sh or solution.yaml")
    steps = _load_yaml(listing)
    if not isinstance(steps, list) or not steps:
        raise TaskFormatError(
            listing, "<document>", f"expected a list of steps, got {excerpt(steps)}"
        )
    commands: list[str] = []
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or "command" not in step:
            raise TaskFormatError(
                listing, f"[{i}].command", f"expected a command, got {excerpt(step)}"
            )
        commands.append(schema.read_text(listing, f"[{i}].command", step["command"]))
        schema.read_timeout(listing, f"[{i}].min_timeout_sec", step.get("min_timeout_sec"), 1.0)
    return None, tuple(commands)


def _compose_context(task_dir: Path) -> Path:
    """The build context of a single-service docker-compose.yaml (the only kind supported)."""
    path = task_dir / "docker-compose.yaml"
    if not path.is_file():
        path = task_dir / "docker-compose.yml"
    data = _read_yaml(path)
    services = schema.check_mapping(path, "services", data.get("services"))
    if len(services) != 1:
        raise TaskFormatError(
            path,
            "services",
            f"expected exactly one service, got {sorted(services)} "
            "(multi-container tasks are not supported)",
        )
    name, service = next(iter(services.items()))
    build = schema.check_mapping(path, f"services.{name}", service).get("build")
    if isinstance(build, str):
        build = {"context": build}
    if not isinstance(build, dict):
        raise TaskFormatError(path, f"services.{name}.build", "expected a build context")
    dockerfile = build.get("dockerfile", "Dockerfile")
    if dockerfile != "Dockerfile":
        raise TaskFormatError(
            path,
            f"services.{name}.build.dockerfile",
            f"expected 'Dockerfile', got {excerpt(dockerfile)}",
        )
    context = (task_dir / str(build.get("context", "."))).resolve()
    if not context.is_relative_to(task_dir.resolve()) or not context.is_dir():
        raise TaskFormatError(
            path, f"services.{name}.build.context", "expected a folder inside the task folder"
        )
    return context


def _environment(task_dir: Path, task_id: str, data: dict[str, Any]) -> TaskEnvironment:
    path = task_dir / "task.yaml"
    if data.get("env_name") is not None:
        raise TaskFormatError(
            path, "env_name", "shared environments are not supported; give the task a Dockerfile"
        )
    has_compose = any(
        (task_dir / n).is_file() for n in ("docker-compose.yaml", "docker-compose.yml")
    )
    if has_compose:
        context = _compose_context(task_dir)
    elif (task_dir / "Dockerfile").is_file():
        context = task_dir
    else:
        raise TaskFormatError(
            task_dir, "Dockerfile", "expected a Dockerfile or docker-compose.yaml"
        )
    plan = read_dockerfile(context / "Dockerfile", context)
    return TaskEnvironment(task_id=task_id, workdir=plan.workdir, build_context=context, plan=plan)


def load_tb1_task(task_dir: Path, *, max_turns: int = 50) -> TerminalBenchTask:
    """Read and validate one Terminal-Bench 1 task folder."""
    task_id = schema.check_task_id(task_dir)
    inputs.check_task_folder(task_dir)
    path = task_dir / "task.yaml"
    data = _read_yaml(path)
    schema.check_keys(path, data, KNOWN_KEYS, strict=True)
    instruction = _instruction(path, data)
    agent_timeout = schema.read_timeout(
        path, "max_agent_timeout_sec", data.get("max_agent_timeout_sec"), DEFAULT_AGENT_TIMEOUT_S
    )
    test_timeout = schema.read_timeout(
        path, "max_test_timeout_sec", data.get("max_test_timeout_sec"), DEFAULT_TEST_TIMEOUT_S
    )
    metadata = {
        "author_name": schema.read_optional_str(path, "author_name", data.get("author_name"), ""),
        "difficulty": schema.read_difficulty(path, "difficulty", data.get("difficulty")),
        "category": schema.read_optional_str(path, "category", data.get("category"), "general"),
        "tags": schema.read_tags(path, "tags", data.get("tags")),
        "run_tests_in_same_shell": schema.read_bool(
            path, "run_tests_in_same_shell", data.get("run_tests_in_same_shell"), False
        ),
    }
    parser = data.get("parser_name", "pytest")
    if parser != "pytest":
        raise TaskFormatError(path, "parser_name", f"expected 'pytest', got {excerpt(parser)}")
    tests_dir, run_tests = task_dir / "tests", task_dir / "run-tests.sh"
    if not tests_dir.is_dir():
        raise TaskFormatError(task_dir, "tests", "expected a tests/ folder")
    if not run_tests.is_file():
        raise TaskFormatError(task_dir, "run-tests.sh", "expected a run-tests.sh script")
    script, commands = _solution(task_dir)
    return TerminalBenchTask(
        task_id=task_id,
        instruction=instruction.strip() + "\n",
        path=task_dir,
        format="tb1",
        environment=_environment(task_dir, task_id, data),
        tests_dir=tests_dir,
        test_script=run_tests,
        test_timeout_s=test_timeout,
        solution_script=script,
        solution_commands=commands,
        timeout_s=agent_timeout,
        max_turns=max_turns,
        metadata=metadata,
    )
