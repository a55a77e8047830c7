"""make_sandbox and the package's public names."""

from __future__ import annotations

import pytest

from environments.sandboxes import (
    BASE_IMAGE,
    SANDBOX_KINDS,
    BwrapSandbox,
    SandboxError,
    SandboxSpec,
    docker_available,
    make_sandbox,
)


def test_bwrap_is_the_default_kind() -> None:
    sb = make_sandbox(SandboxSpec())
    try:
        assert isinstance(sb, BwrapSandbox)
        assert sb.execute("echo ok", 5).output == "ok\n"
    finally:
        sb.close()


def test_unknown_kind_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'podman'.*\('bwrap', 'docker'\)"):
        make_sandbox(SandboxSpec(), "podman")
    assert SANDBOX_KINDS == ("bwrap", "docker")


def test_base_image_name() -> None:
    assert BASE_IMAGE == "thundersync/base:bookworm"


def test_docker_without_a_daemon_is_a_sandbox_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert docker_available() is False
    with pytest.raises(SandboxError, match="no Docker daemon"):
        make_sandbox(SandboxSpec(), "docker")
