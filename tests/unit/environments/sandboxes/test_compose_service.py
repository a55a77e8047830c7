"""A compose service's container as Harbor's collection phase reaches it (``ServiceSandbox``)
and a service that died mid-episode (``check_alive``), against a fake Docker client (no Docker
needed): a hook runs ``sh -c`` as its user, bounded by its timeout even where the image has no
``timeout`` program and the exec never returns; a dead service's error quotes the end of its
logs, bounded, and names the service."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from environments.sandboxes import compose
from environments.sandboxes.protocol import AgentBrokeSandbox, SandboxError, ServiceSpec


class FakeContainer:
    def __init__(self, *, status: str = "running", logs: bytes = b"", reply: Any = (0, b"")):
        self.status = status
        self.attrs = {"State": {"ExitCode": 9}}
        self._logs = logs
        self.reply = reply
        self.calls: list[tuple[list[str], str]] = []
        self.release = threading.Event()

    def reload(self) -> None:
        pass

    def logs(self, tail: int) -> bytes:
        return b"\n".join(self._logs.split(b"\n")[-tail:])

    def exec_run(self, argv: list[str], user: str = "") -> Any:
        self.calls.append((argv, user))
        if self.reply is None:  # an exec that never returns by itself
            self.release.wait()
            return (0, b"")
        return self.reply


class FakeClient:
    def __init__(self, container: FakeContainer) -> None:
        self.containers = self
        self.container = container

    def get(self, name: str) -> FakeContainer:
        return self.container


def service(container: FakeContainer) -> compose.ServiceSandbox:
    made = compose.Services(holder="h", containers=["thundersync-0123456789ab-kv"])
    found = compose.service_sandbox(FakeClient(container), made, "kv", "thundersync-0123456789ab")
    assert found is not None
    return found


def test_a_hook_runs_sh_c_as_its_user_bounded_by_timeout() -> None:
    container = FakeContainer(reply=(3, b"dumped\n"))
    kv = service(container)
    kv.exec_user = "postgres"
    result = kv.execute("pg_dump > /tmp/x", timeout=7.9)
    assert (result.output, result.exit_code, result.timed_out) == ("dumped\n", 3, False)
    ((argv, user),) = container.calls
    assert argv[:2] == ["sh", "-c"] and "timeout -s KILL" in argv[2]
    assert argv[3:] == ["7", "pg_dump > /tmp/x"] and user == "postgres"


def test_an_exec_that_never_returns_is_given_up_after_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compose.ServiceSandbox, "GRACE_S", 0.05)
    container = FakeContainer(reply=None)
    try:
        result = service(container).execute("sleep infinity", timeout=0.05)
    finally:
        container.release.set()
    assert result.timed_out and result.exit_code is None


def test_no_such_service_is_none() -> None:
    made = compose.Services(holder="h", containers=["thundersync-0123456789ab-kv"])
    client = FakeClient(FakeContainer())
    assert compose.service_sandbox(client, made, "db", "thundersync-0123456789ab") is None
    assert compose.service_sandbox(client, None, "kv", "thundersync-0123456789ab") is None


def test_a_service_exiting_mid_episode_is_the_agents_failure_quoting_its_last_log_lines() -> None:
    """The agent's requests reach a service: one it crashed must score 0, not be excluded."""
    noise = b"\n".join(b"line %d " % i + b"x" * 500 for i in range(100))
    container = FakeContainer(status="exited", logs=noise + b"\nboom: out of disk")
    made = compose.Services(holder="h", containers=["thundersync-0123456789ab-kv"])
    with pytest.raises(AgentBrokeSandbox) as caught:
        compose.check_alive(FakeClient(container), made, (ServiceSpec(name="kv"),))
    message = str(caught.value)
    assert message.startswith("service kv stopped: it exited (code 9) during the episode")
    assert message.endswith("boom: out of disk") and "line 99" in message
    assert "line 80 " not in message  # only the last 20 lines
    assert len(message) < compose.LOG_CHARS + 200


def test_a_service_the_engine_failed_mid_episode_is_an_infrastructure_failure() -> None:
    container = FakeContainer(status="dead", logs=b"kv up")
    container.attrs["State"]["Error"] = "container kill failed: device or resource busy"
    made = compose.Services(holder="h", containers=["thundersync-0123456789ab-kv"])
    with pytest.raises(SandboxError, match="the container engine stopped it during the episode"):
        compose.check_alive(FakeClient(container), made, (ServiceSpec(name="kv"),))


def test_after_the_verifier_only_a_service_stopped_before_it_began_counts() -> None:
    """Docker's ``FinishedAt`` (nanoseconds, UTC) against when grading began: a service that
    stopped while the verifier ran was seen by the verifier."""
    container = FakeContainer(status="exited")
    container.attrs["State"]["FinishedAt"] = "2026-12-06T12:00:00.250000000Z"
    made = compose.Services(holder="h", containers=["thundersync-0123456789ab-kv"])
    specs = (ServiceSpec(name="kv"),)
    noon = datetime(2026, 12, 6, 12, tzinfo=UTC).timestamp()
    compose.check_alive(FakeClient(container), made, specs, until=noon + 0.25)
    with pytest.raises(AgentBrokeSandbox):
        compose.check_alive(FakeClient(container), made, specs, until=noon + 0.26)
    container.attrs["State"]["FinishedAt"] = "2026-12-06T13:00:00+01:00"  # an offset: the same
    compose.check_alive(FakeClient(container), made, specs, until=noon)
    container.attrs["State"]["FinishedAt"] = "0001-01-01T00:00:00Z garbage"  # unsaid: counts
    with pytest.raises(AgentBrokeSandbox):
        compose.check_alive(FakeClient(container), made, specs, until=noon)


def test_no_services_nothing_to_check() -> None:
    compose.check_alive(FakeClient(FakeContainer(status="exited")), None, ())
