"""Reading a Harbor task's environment/docker-compose.yaml (``compose_task``): the services beside
``main`` in ``depends_on`` order, Compose's ``${VAR}`` interpolation from the task's env, what is
refused in one line, and bubblewrap refusing the task before the episode; no Docker needed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.sandboxes.protocol import NeedsDockerError, SandboxSpec
from environments.tasks import TaskFormatError
from environments.terminal_bench import load_tasks
from environments.terminal_bench.compose_task import read_services

ROOT = Path(__file__).resolve().parents[4]
NOTES_FIXTURE = ROOT / "tests/fixtures/harbor-1.4/compose-sidecar"
FIXTURE = ROOT / "environments/fixtures/terminal_bench/published/compose-sidecar"


def read(tmp_path: Path, compose: str, variables: dict[str, str] | None = None):
    env_dir = tmp_path / "environment"
    for name in ("a", "b", "c"):
        (env_dir / name).mkdir(parents=True, exist_ok=True)
        (env_dir / name / "Dockerfile").write_text("FROM thundersync/base:bookworm\n")
    (env_dir / "docker-compose.yaml").write_text(compose)
    return read_services(env_dir, tmp_path, variables=variables or {}, memory_mb=512, cpus=0.5)


def test_harbor_notes_example_reads_with_its_env_interpolated() -> None:
    """The example written from harbor 0.26's models (docs/harbor-0.26-notes.md)."""
    services, main_env = read_services(
        NOTES_FIXTURE / "environment",
        NOTES_FIXTURE,
        variables={"API_TOKEN": "${API_TOKEN:-tok-1234}"},
        memory_mb=1024,
        cpus=2.0,
    )
    (api,) = services
    assert api.name == "api" and api.build_context == NOTES_FIXTURE / "environment" / "api"
    assert api.env == {"API_TOKEN": "tok-1234"}
    assert "http://localhost:8080/health" in (api.healthcheck or "")
    assert api.start_timeout_s == 15 * (2 + 5)  # retries × (interval + timeout)
    assert (api.memory_mb, api.cpus) == (1024, 2.0) and main_env == {}


def test_services_start_after_what_they_depend_on(tmp_path: Path) -> None:
    services, main_env = read(
        tmp_path,
        "services:\n"
        "  main: {depends_on: [a], environment: [MODE=fast]}\n"
        "  a: {build: ./a, depends_on: {b: {condition: service_healthy}}}\n"
        "  b: {build: {context: ./b}, depends_on: [c], command: python3 -m http.server 80}\n"
        "  c: {image: 'ubuntu:24.04', environment: {DEBUG: true, EMPTY: null}, user: 1000,\n"
        "      working_dir: /srv, entrypoint: [python3, -u]}\n",
    )
    assert [s.name for s in services] == ["c", "b", "a"]
    assert services[1].command == ("python3", "-m", "http.server", "80")
    assert services[0].image == "ubuntu:24.04" and services[0].env == {"DEBUG": "true", "EMPTY": ""}
    assert (services[0].user, services[0].working_dir) == ("1000", "/srv")
    assert services[0].entrypoint == ("python3", "-u")
    assert main_env == {"MODE": "fast"}
    assert all((s.memory_mb, s.cpus) == (512, 0.5) for s in services)


@pytest.mark.parametrize(
    ("compose", "field", "words"),
    [
        ("services:\n  a: {build: ./a, network_mode: host}\n", "services.a.network_mode", "route"),
        ("services:\n  a: {build: ./a, volumes: ['/:/host']}\n", "services.a.volumes", "host"),
        ("services:\n  a: {build: ./a, privileged: true}\n", "services.a.privileged", "not"),
        ("services:\n  main: {image: x}\n", "services.main.image", "environment/Dockerfile"),
        ("services:\n  a: {build: ./a}\nvolumes: {data: {}}\n", "volumes", "not supported"),
        ("services:\n  a: {build: ./a, depends_on: [a]}\n", "services.a.depends_on", "cycle"),
        ("services:\n  a: {build: ./a, depends_on: [z]}\n", "services.a.depends_on", "'z'"),
        ("services:\n  main: {depends_on: [z]}\n", "services.main.depends_on", "'z'"),
        (
            "services:\n  a: {build: ./a, depends_on: {b: {condition: "
            "service_completed_successfully}}}\n  b: {build: ./b}\n",
            "services.a.depends_on.b.condition",
            "service_healthy",
        ),
        ("services:\n  a: {build: ./a, environment: {K: '${NEED:?set NEED}'}}\n", "", "set NEED"),
        ("services:\n  a: {build: ./nowhere}\n", "services.a.build.context", "Dockerfile"),
        ("services:\n  a: {build: ../../..}\n", "services.a.build.context", "outside"),
        (
            "services:\n  a: {build: {context: ./a, dockerfile: Dockerfile.dev}}\n",
            "services.a.build.dockerfile",
            "'Dockerfile.dev'",
        ),
        ("services:\n  a: {}\n", "services.a", "build context or an image"),
    ],
)
def test_what_is_refused_is_named_in_one_line(
    tmp_path: Path, compose: str, field: str, words: str
) -> None:
    with pytest.raises(TaskFormatError) as err:
        read(tmp_path, compose)
    assert field in str(err.value) and words in str(err.value)


def test_extension_fields_and_anchors_are_read_as_compose_reads_them(tmp_path: Path) -> None:
    services, _ = read(
        tmp_path,
        "x-common: &common\n  environment: {LEVEL: debug}\n"
        "services:\n  a:\n    <<: *common\n    build: ./a\n    x-note: for tools\n",
    )
    assert services[0].env == {"LEVEL": "debug"}


def test_ignored_keys_and_unset_variables_warn(tmp_path: Path) -> None:
    compose = "services:\n  a: {build: ./a, ports: ['80:80'], environment: {K: '${UNSET}$$x'}}\n"
    with pytest.warns(UserWarning) as seen:
        (service,), _ = read(tmp_path, compose)
    assert service.env == {"K": "$x"}
    assert any("ports" in str(w.message) for w in seen)
    assert any("UNSET" in str(w.message) for w in seen)


def test_bubblewrap_refuses_a_compose_task_naming_docker_and_docker_gets_its_services() -> None:
    task = load_tasks(FIXTURE).get("compose-sidecar")
    with pytest.raises(NeedsDockerError) as err:
        task.sandbox_spec("bwrap")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("task compose-sidecar needs Docker: its environment/docker-compose")
    assert "(kv)" in message
    spec = task.sandbox_spec("docker")
    assert [s.name for s in spec.services] == ["kv"]
    assert (spec.services[0].memory_mb, spec.services[0].cpus) == (spec.memory_mb, spec.cpus)


def test_a_task_without_a_compose_file_has_no_services(tmp_path: Path) -> None:
    task_dir = tmp_path / "compose-sidecar"
    shutil.copytree(FIXTURE, task_dir)
    (task_dir / "environment" / "docker-compose.yaml").unlink()
    task = load_tasks(task_dir).get("compose-sidecar")
    assert task.environment.services == () and task.sandbox_spec("docker").services == ()


@pytest.mark.parametrize(
    ("lines", "disk_mb"),
    [("storage_mb = 512\n", 512), ('storage = "1G"\n', 1024), ("", SandboxSpec().disk_mb)],
)
def test_storage_mb_sizes_the_work_folders_disk(tmp_path: Path, lines: str, disk_mb: int) -> None:
    task_dir = tmp_path / "compose-sidecar"
    shutil.copytree(FIXTURE, task_dir)
    path = task_dir / "task.toml"
    text = path.read_text().replace("storage_mb = 512\n", "")
    path.write_text(text.replace("[environment]\n", f"[environment]\n{lines}"))
    task = load_tasks(task_dir).get("compose-sidecar")
    assert task.sandbox_spec("docker").disk_mb == disk_mb
    assert task.sandbox_spec(None).disk_mb == disk_mb


def test_a_separate_verifier_image_runs_alone_and_the_fallback_gets_fresh_services(
    tmp_path: Path,
) -> None:
    task_dir = tmp_path / "compose-sidecar"
    shutil.copytree(FIXTURE, task_dir)
    path = task_dir / "task.toml"
    path.write_text(
        path.read_text().replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    )
    fallback = load_tasks(task_dir).get("compose-sidecar")
    assert (
        fallback.verifier is not None
        and fallback.verifier.services == fallback.environment.services
    )
    (task_dir / "tests" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY . /tests/\n"
    )
    own = load_tasks(task_dir).get("compose-sidecar")
    assert own.verifier is not None and own.verifier.services == ()
