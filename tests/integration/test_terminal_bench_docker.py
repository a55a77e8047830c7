"""The shipped Terminal-Bench 1 and Harbor tasks in Docker: their Dockerfiles are built with the
local daemon (offline, FROM the project's base image); oracle scores 1 and nop scores 0."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from environments.sandboxes import Sandbox, SandboxError, make_sandbox
from environments.sandboxes.image_build import ALIASES_VARIABLE, use_image_aliases
from environments.tasks import Grade, GradingContext
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.dockerfile import BASE_IMAGE

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).resolve().parents[2] / "environments" / "fixtures" / "terminal_bench"
TASKS = [task for fmt in ("tb1", "harbor") for task in load_tasks(FIXTURES / fmt)]


@contextmanager
def docker_sandbox(task: TerminalBenchTask, kind: str | None = "docker") -> Iterator[Sandbox]:
    sandbox = make_sandbox(task.sandbox_spec(kind), kind="docker")
    try:
        task.setup(sandbox)
        yield sandbox
    finally:
        sandbox.close()


def run_agent(
    task: TerminalBenchTask, agent: str, kind: str | None = "docker", *, strict: bool | None = None
) -> Grade:
    """Grade without a context (None), or strictly or not with fresh sandboxes it closes."""
    made: list[Sandbox] = []

    def fresh() -> Sandbox:
        made.append(make_sandbox(task.sandbox_spec(kind), kind="docker"))
        return made[-1]

    context = None if strict is None else GradingContext(fresh_sandbox=fresh, strict=strict)
    try:
        with docker_sandbox(task, kind) as sandbox:
            if agent == "oracle":
                for cmd in task.reference_solution():
                    done = sandbox.execute(cmd, timeout=task.timeout_s)
                    assert done.exit_code == 0, done.output[-2000:]
            return task.grade(sandbox, context)
    finally:
        for other in made:
            other.close()


@pytest.fixture
def ubuntu_alias(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ALIASES_VARIABLE, raising=False)
    use_image_aliases({"ubuntu:24.04": BASE_IMAGE})
    yield
    use_image_aliases({})


def test_a_public_base_image_is_refused_with_the_alias_that_would_help() -> None:
    import docker

    client = docker.from_env()
    try:
        if any("ubuntu:24.04" in image.tags for image in client.images.list("ubuntu")):
            pytest.skip("this daemon has an ubuntu:24.04 image: the task builds without an alias")
    finally:
        client.close()
    task = load_tasks(FIXTURES / "published" / "ubuntu-word-count").get("ubuntu-word-count")
    with pytest.raises(SandboxError, match=f"pass --image-alias ubuntu:24.04={BASE_IMAGE}"):
        make_sandbox(task.sandbox_spec("docker"), kind="docker")


@pytest.mark.parametrize("task_id", ["ubuntu-word-count", "greeting-file"])
def test_published_style_tasks_in_docker(ubuntu_alias: None, task_id: str) -> None:
    """FROM ubuntu:24.04 through an alias; scripts that hard-code /solution, /tests and
    /logs/verifier/reward.txt."""
    task = load_tasks(FIXTURES / "published" / task_id).get(task_id)
    oracle, nop = run_agent(task, "oracle", strict=True), run_agent(task, "nop", strict=True)
    assert (oracle.reward, oracle.infra_failure) == (1.0, False), oracle.details
    assert (nop.reward, nop.infra_failure) == (0.0, False), nop.details


def test_staged_spec_replays_run_steps_in_docker_too() -> None:
    task = next(t for t in TASKS if t.format == "harbor" and t.task_id == "git-revert-commit")
    assert task.sandbox_spec().build_context is None
    assert run_agent(task, "oracle", kind=None).reward == 1.0


def test_docker_builds_what_bubblewrap_cannot(tmp_path: Path) -> None:
    task_dir = tmp_path / "sort-files"
    shutil.copytree(FIXTURES / "harbor" / "sort-files", task_dir)
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text() + "RUN printf '#!/bin/sh\\necho built\\n' > /usr/local/bin/tool && "
        "chmod +x /usr/local/bin/tool\n"
    )
    task = load_tasks(task_dir).get("sort-files")
    assert task.needs_docker_reason is None  # a RUN step: bubblewrap only finds out on replay
    with docker_sandbox(task) as sandbox:
        assert sandbox.execute("tool", timeout=30).output.strip() == "built"
        assert task.grade(sandbox).reward == 0.0


def test_an_agent_that_deletes_mkdir_scores_zero_not_infra() -> None:
    task = next(t for t in TASKS if t.format == "harbor" and t.task_id == "sort-files")
    with docker_sandbox(task) as sandbox:
        for cmd in [*task.reference_solution(), "rm -f /usr/bin/mkdir /bin/mkdir"]:
            assert sandbox.execute(cmd, timeout=task.timeout_s).exit_code == 0
        grade = task.grade(sandbox)
    assert (grade.reward, grade.infra_failure) == (0.0, False), grade.details
    assert grade.details["grader_setup_failed"] is True
    assert "mkdir" in grade.details["reason"]
