"""Who failed when a Docker sandbox's container does not start again (``restart_failure``):
the agent only where the daemon refused the container's root filesystem and a fresh container
of its image starts; a daemon that timed out, lost its connection or answered otherwise is the
daemon's (red team, 2026-12-07: blaming the agent for those zeroed episodes the agent never
touched). Fakes of the SDK's objects: no daemon needed."""

from __future__ import annotations

from typing import Any

import pytest

from environments.sandboxes.docker_daemon import restart_failure
from environments.sandboxes.protocol import AgentBrokeSandbox, SandboxError

ROOTFS = (
    'OCI runtime create failed: error mounting "/usr/bin/docker-init" to rootfs at '
    '"/sbin/docker-init": not a directory'
)


class Refused(Exception):
    """The SDK's APIError as far as ``restart_failure`` reads it: a response's status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.response = type("Response", (), {"status_code": status})()


class Probe:
    removed = False

    def remove(self, force: bool = False) -> None:
        self.removed = force


class Client:
    def __init__(self, starts: bool) -> None:
        self.starts, self.probes = starts, []
        self.containers = self

    def run(self, image: str, command: list[str], **options: Any) -> Probe:
        if not self.starts:
            raise Refused(500, "the daemon is gone")
        assert options["network_mode"] == "none" and options["init"] is True
        self.probes.append(Probe())
        return self.probes[-1]


CONTAINER = type("Container", (), {"name": "thundersync-x", "attrs": {"Image": "sha256:ab"}})()


def test_a_refused_root_filesystem_with_a_fresh_container_starting_is_the_agents() -> None:
    client = Client(starts=True)
    failure = restart_failure(client, CONTAINER, {}, Refused(400, ROOTFS))
    assert isinstance(failure, AgentBrokeSandbox), failure
    assert [p.removed for p in client.probes] == [True]


def test_a_refused_root_filesystem_with_no_fresh_container_starting_is_the_daemons() -> None:
    failure = restart_failure(Client(starts=False), CONTAINER, {}, Refused(400, ROOTFS))
    assert isinstance(failure, SandboxError)


@pytest.mark.parametrize(
    "exc",
    [TimeoutError("read timed out"), ConnectionError("connection reset"), Refused(500, ROOTFS)]
    + [Refused(400, "error while mounting volume: no such device")],
    ids=["timeout", "connection", "server-error", "volume"],
)
def test_other_start_failures_are_the_daemons_and_start_no_probe(exc: Exception) -> None:
    client = Client(starts=True)
    assert isinstance(restart_failure(client, CONTAINER, {}, exc), SandboxError)
    assert client.probes == []
