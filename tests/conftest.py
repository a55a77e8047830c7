"""Shared test configuration: hypothesis profiles (HYPOTHESIS_PROFILE=ci|dev), tiny models,
Docker availability (loud skip), the check that no sandbox outlives the tests, and how the
suite runs in parallel (``make test``: pytest-xdist workers, then the ``serial`` tests alone)."""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

# Under pytest-xdist each worker is one of two processes sharing the cores: one torch thread
# each (set before torch is imported; subprocesses inherit it), so they do not fight.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from filelock import FileLock
from hypothesis import HealthCheck, settings

from environments.sandboxes import BASE_IMAGE, docker_available
from environments.sandboxes.bwrap import MARKER_PREFIX

# Task fixtures carry their own tests (a Harbor task's tests/test_outputs.py runs inside its
# sandbox, against /tests and /app): they are data here, never collected.
collect_ignore_glob = ["fixtures/*"]

settings.register_profile(
    "dev", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Ray tests run in the parallel part, one private Ray head at a time (each counts
    the Ray processes and folders left behind): they live in one file, which ``--dist
    loadfile`` hands whole to one worker, and no other test starts Ray. A Ray test in a second
    file would break that, so it is refused here."""
    files = sorted({str(item.path) for item in items if item.get_closest_marker("ray")})
    if len(files) > 1:
        raise pytest.UsageError(f"Ray tests in {len(files)} files ({', '.join(files)}): keep one")


T = TypeVar("T")


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]
) -> T:
    """``build(folder)`` run once for the whole test run, its workers included: the first
    worker to ask builds under a file lock in the run's shared temporary folder, the others
    wait and reuse the folder and the value ``build`` returned (pickled beside it)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / name
    built = shared.with_name(name + ".built.pickle")
    with FileLock(str(shared) + ".lock"):
        if built.exists():
            return pickle.loads(built.read_bytes())
        shared.mkdir()
        value = build(shared)
        built.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture(scope="session", autouse=True)
def _leaderboard_in_a_temporary_folder(tmp_path_factory) -> Iterator[None]:
    """Commands append to the leaderboard by default: keep the tests' rows out of the checkout
    (subprocesses inherit the variable)."""
    path = tmp_path_factory.mktemp("leaderboard") / "leaderboard.sqlite"
    previous = os.environ.get("THUNDERSYNC_LEADERBOARD")
    os.environ["THUNDERSYNC_LEADERBOARD"] = str(path)
    yield
    if previous is None:
        os.environ.pop("THUNDERSYNC_LEADERBOARD", None)
    else:
        os.environ["THUNDERSYNC_LEADERBOARD"] = previous


@pytest.fixture(scope="session", autouse=True)
def _reference_runs_in_a_temporary_folder(tmp_path_factory) -> Iterator[None]:
    """Strict grading caches each task's reference run (``environments/proof/
    reference.py``): the tests' cache is their own, computed afresh each session."""
    from environments.proof.reference import CACHE_VARIABLE

    previous = os.environ.get(CACHE_VARIABLE)
    os.environ[CACHE_VARIABLE] = str(built_once(tmp_path_factory, "reference-runs", Path))
    yield
    if previous is None:
        os.environ.pop(CACHE_VARIABLE, None)
    else:
        os.environ[CACHE_VARIABLE] = previous


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """Tiny checkpoints built once per session: {"gpt2": Path, "qwen3": Path, "llama": Path}."""
    from thundersync.models import build_tiny_model

    def build(root: Path) -> dict[str, Path]:
        return {arch: build_tiny_model(root / arch, arch) for arch in ("gpt2", "qwen3", "llama")}

    return built_once(tmp_path_factory, "tiny-models", build)


SANDBOX_KINDS = [
    pytest.param(
        "bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
    ),
    pytest.param("docker", marks=pytest.mark.docker),
]
"""Both sandbox kinds as test parameters (``kind``): bwrap where bubblewrap is installed, docker
where a daemon and the base image are (a ``docker``-marked test skips loudly otherwise)."""


def in_sandboxes(
    cases: Sequence[object],
    docker: Callable[[Any], bool],
    ids: Callable[[Any], str] = str,
) -> list[Any]:
    """Parameters ``kind`` then the case's own (a tuple's items, or the case): every case in
    bubblewrap, and in Docker the cases ``docker`` picks. Docker grades with the same code
    through another engine (the agent as root, the engine's archive API, its exec), so the
    cases that reach what differs run there too: a hack that works only as root, one through
    ``/logs`` or the engine's copy, one per mechanism of the witness. The others, whose outcome
    the grader's logic decides alike in both, run in bubblewrap alone: at ~0.85 s a Docker
    sandbox and ~63 ms an exec they were most of CI's time (docs/measurements.md)."""
    bwrap, container = SANDBOX_KINDS
    params = []
    for case in cases:
        values = case if isinstance(case, tuple) else (case,)
        params.append(pytest.param("bwrap", *values, marks=bwrap.marks, id=f"bwrap-{ids(case)}"))
        if docker(case):
            mark, name = container.marks, f"docker-{ids(case)}"
            params.append(pytest.param("docker", *values, marks=mark, id=name))
    return params


DOCKER_HINT = (
    "start one with `dockerd --bridge=none --iptables=false &` and build the base image with "
    "`environments/sandboxes/images/build_base_image.sh`"
)


def _docker_missing_reason() -> str | None:
    """Why Docker tests cannot run here, or None when they can."""
    if not docker_available():
        return f"DOCKER TESTS SKIPPED: no Docker daemon reachable; {DOCKER_HINT}"
    import docker

    client = docker.from_env(timeout=10)
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        return f"DOCKER TESTS SKIPPED: base image {BASE_IMAGE} is missing; {DOCKER_HINT}"
    finally:
        client.close()
    return None


@pytest.fixture(scope="session")
def docker_ready() -> None:
    """Skip (loudly, with the fix) when no Docker daemon or base image is available."""
    reason = _docker_missing_reason()
    if reason is not None:
        warnings.warn(reason, stacklevel=1)
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _skip_docker_marked(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("docker") is not None:
        request.getfixturevalue("docker_ready")


def leftover_sandbox_processes(owner_pid: int | None = None) -> list[str]:
    """``pid: cmdline`` of live processes carrying a bubblewrap sandbox marker of ``owner_pid``
    (default: this process) in their command line or environment."""
    marker = f"{MARKER_PREFIX}{owner_pid or os.getpid()}-".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{name}/environ", "rb") as fh:
                environ = fh.read()
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if marker in cmdline or marker in environ:
            shown = cmdline.replace(b"\0", b" ")[:200]
            found.append(f"{name}: {shown!r}")
    return found


def leftover_containers(owner_pid: int | None = None) -> list[str]:
    """Names of containers (running or not) made by ``owner_pid``'s DockerSandboxes."""
    if not docker_available():
        return []
    import docker

    client = docker.from_env(timeout=10)
    try:
        label = f"thundersync.owner_pid={owner_pid or os.getpid()}"
        return [c.name for c in client.containers.list(all=True, filters={"label": label})]
    finally:
        client.close()


@pytest.fixture
def leftovers() -> object:
    """The leftover checks, for tests that assert after each sandbox: (processes, containers)."""

    def check() -> tuple[list[str], list[str]]:
        return leftover_sandbox_processes(), leftover_containers()

    return check


@pytest.fixture(scope="session", autouse=True)
def no_sandbox_left_behind() -> Iterator[None]:
    """Fail the session when any sandbox process or labelled container outlives the tests."""
    yield
    processes, containers = leftover_sandbox_processes(), leftover_containers()
    if processes or containers:
        pytest.fail(
            f"sandboxes left behind: processes {processes}, containers {containers}",
            pytrace=False,
        )
