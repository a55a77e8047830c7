"""A process the agent leaves running takes no part in grading (Docker): watched from the
host, before each command default grading runs in the agent's own sandbox. The task and the
hack are the Terminal-Bench hacks' (``test_reward_hacks_terminal_bench.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

from environments.sandboxes import ExecResult, Sandbox, make_sandbox
from environments.terminal_bench import TerminalBenchTask
from tests.integration.test_reward_hacks_terminal_bench import AGENT_PROGRAM_HACKS, make_task


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TerminalBenchTask]:
    yield make_task(tmp_path_factory.mktemp("daemon"), "harbor")


class WatchedSandbox:
    """A sandbox that, before each command grading runs in it, lists the container's
    processes from the host (``docker top``: the daemon's host-side ``ps``, never a program
    of the container, which the agent could have replaced)."""

    def __init__(self, inner: Sandbox) -> None:
        self.inner, self.workdir = inner, inner.workdir
        self.seen: list[list[str]] = []

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        self.seen.append(container_processes(self.inner))
        return self.inner.execute(cmd, timeout)

    def upload(self, src: Path, dst: str) -> None:
        self.inner.upload(src, dst)

    def download(self, src: str, dst: Path) -> None:
        self.inner.download(src, dst)

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        self.inner.export_folder(path, dst, exclude=exclude)

    def stop_processes(self) -> None:
        self.inner.stop_processes()

    def close(self) -> None:
        self.inner.close()


def container_processes(sandbox: Sandbox) -> list[str]:
    """The command lines of every process in ``sandbox``'s container ([] when stopped)."""
    import docker

    client = docker.from_env()
    try:
        container = client.containers.get(sandbox.marker)  # type: ignore[attr-defined]
        if container.status != "running":
            return []
        try:
            top = container.top()
        except docker.errors.APIError:
            container.reload()
            if container.status != "running":
                return []
            raise
        return [" ".join(str(field) for field in row) for row in top["Processes"] or []]
    finally:
        client.close()


@pytest.mark.docker
def test_no_process_of_the_agent_survives_into_default_grading(task: TerminalBenchTask) -> None:
    """Deterministic: a daemon carrying a unique token in its argv, left running by a replaced
    ``/bin/sh`` that skips the exec wrapper's kill loop, is seen alive after the agent's turn,
    and seen in no process list taken before any command of default grading (which runs the
    tests in the agent's own sandbox)."""
    token = f"thundersync-daemon-{uuid.uuid4().hex}"
    sandbox = WatchedSandbox(make_sandbox(task.sandbox_spec("docker"), kind="docker"))
    try:
        task.setup(sandbox.inner)
        for command in [
            *AGENT_PROGRAM_HACKS["replaced-sh-keeps-a-daemon"][:2],
            f"nohup bash -c 'while :; do sleep 1; done; : {token}' >/dev/null 2>&1 &",
        ]:
            sandbox.inner.execute(command, timeout=60)
        alive = [line for line in container_processes(sandbox.inner) if token in line]
        assert alive, "the hack did not work: no daemon outlived the agent's command"
        grade = task.grade(sandbox)
        assert not grade.infra_failure, grade.details
        assert sandbox.seen, "default grading ran no command in the sandbox"
        survivors = [line for seen in sandbox.seen for line in seen if token in line]
        assert survivors == [], survivors
    finally:
        sandbox.close()
