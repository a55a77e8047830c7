"""Harbor's separate verifier environment: the image a task's tests run in, from task.toml's
``[verifier]`` and ``tests/Dockerfile``.

Harbor (schema 1.4, ``harbor init``'s default) runs the verifier in its own container when
``[verifier] environment_mode = "separate"`` or a ``[verifier.environment]`` table is set; its
image is ``[verifier.environment] docker_image``, else one built from ``tests/Dockerfile`` (build
context ``tests/``), else a fresh copy of the task's own environment. Without either key the
verifier shares the agent's environment and ``tests/Dockerfile`` is ignored, as Harbor does.

Here the separate verifier is a ``TaskEnvironment`` like the task's own: Docker builds
``tests/Dockerfile``; bubblewrap applies it as a Dockerfile plan (base image, ``ENV``, ``COPY``),
except that ``COPY`` into ``/tests`` is uploaded with the tests (the grader owns that folder)
and a ``RUN`` step needs Docker: replayed in the work folder, its effects would be replaced by
the agent's work. The agent's work folder is copied into it before the tests run
(``TerminalBenchTask.grade``).
"""

from __future__ import annotations

import dataclasses
import posixpath
from pathlib import Path
from typing import Any

from environments.tasks import TaskFormatError
from environments.terminal_bench import inputs, schema
from environments.terminal_bench.dockerfile import DockerfilePlan, read_dockerfile
from environments.terminal_bench.environment import TaskEnvironment
from environments.terminal_bench.grading import TESTS_DIR
from thundersync.protocol.documents import excerpt

MODES = ("shared", "separate")
ENVIRONMENT_KEYS = frozenset({"docker_image", "network_mode", "allowed_hosts", "allow_internet"})
"""Keys of ``[verifier.environment]`` that are read (the network keys by ``network.py``); others
(limits) warn: the verifier gets the task's limits."""


def _mode(path: Path, table: dict[str, Any]) -> str:
    mode = table.get("environment_mode")
    if mode is not None and mode not in MODES:
        raise TaskFormatError(
            path,
            "verifier.environment_mode",
            f"expected 'shared' or 'separate', got {excerpt(mode)}",
        )
    if "environment" not in table:
        return mode or "shared"
    if mode == "shared":
        raise TaskFormatError(
            path,
            "verifier.environment",
            "a verifier environment conflicts with environment_mode = 'shared'",
        )
    return "separate"


def _plan(dockerfile: Path, workdir: str) -> DockerfilePlan:
    plan = read_dockerfile(dockerfile, dockerfile.parent, tests_dir=TESTS_DIR)
    if plan.workdir != workdir:
        raise TaskFormatError(
            dockerfile,
            "WORKDIR",
            f"expected the task's workdir {workdir} (the agent's work is copied there), "
            f"got {plan.workdir}",
        )
    if plan.run_steps and plan.build_step is None:
        step = plan.run_steps[0].command[:120]
        reason = f"RUN {step}: a verifier image's RUN steps are built by Docker only"
        plan = dataclasses.replace(plan, build_step=reason)
    return plan


def read_verifier_environment(
    task_dir: Path, table: dict[str, Any], environment: TaskEnvironment
) -> TaskEnvironment | None:
    """The separate verifier's environment (None: the verifier shares the agent's sandbox).
    It has the task's workdir, limits and ``[environment] env``; a malformed
    ``tests/Dockerfile`` or one whose WORKDIR is not the task's raises TaskFormatError. An
    image of its own runs alone; the task's environment (the fallback) with its compose
    services, fresh ones, as Harbor builds environment/ again for it."""
    path = task_dir / "task.toml"
    if _mode(path, table) == "shared":
        return None
    own = schema.check_mapping(path, "verifier.environment", table.get("environment", {}))
    schema.check_keys(path, own, ENVIRONMENT_KEYS, prefix="verifier.environment.", strict=False)
    image = own.get("docker_image")
    if image is not None:
        if not isinstance(image, str) or not image.strip():
            field = "verifier.environment.docker_image"
            raise TaskFormatError(path, field, f"expected an image, got {excerpt(image)}")
        return dataclasses.replace(
            environment, build_context=None, plan=None, image=image, services=()
        )
    dockerfile = task_dir / "tests" / "Dockerfile"
    if not dockerfile.is_file():
        return environment
    plan = _plan(dockerfile, environment.workdir)
    return dataclasses.replace(
        environment, build_context=dockerfile.parent, plan=plan, image=None, services=()
    )


def test_copy_uploads(plan: DockerfilePlan | None, task_dir: Path) -> list[tuple[Path, str]]:
    """The verifier image's ``COPY`` into /tests as uploads (host file, path under /tests)."""
    uploads: list[tuple[Path, str]] = []
    for copy in plan.test_copies if plan is not None else ():
        for source in copy.sources:
            if source.is_dir():
                for host, rel in inputs.list_files(source, task_dir):
                    uploads.append((host, posixpath.normpath(posixpath.join(copy.dest, rel))))
            else:
                host = inputs.inside(source, task_dir, source.name)
                name = posixpath.join(copy.dest, source.name) if copy.dest_is_dir else copy.dest
                uploads.append((host, posixpath.normpath(name)))
    return uploads
