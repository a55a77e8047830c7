"""A spec may join only a services holder's network namespace (no Docker needed): a plugin's or
a caller's ``SandboxSpec(network=...)`` cannot put a sandbox on the host's network or a bridge."""

from __future__ import annotations

import pytest

from environments.sandboxes.compose import is_services_network
from environments.sandboxes.docker import DockerSandbox
from environments.sandboxes.protocol import SandboxSpec


@pytest.mark.parametrize(
    "network",
    ["host", "bridge", "default", "container:other", "container:thundersync-0123456789ab"],
)
def test_a_network_that_is_not_a_holders_is_refused_before_the_daemon(network: str) -> None:
    assert not is_services_network(network)
    with pytest.raises(ValueError, match="SandboxSpec.network"):
        DockerSandbox(SandboxSpec(network=network), client=object())


def test_a_holders_namespace_is_a_services_network() -> None:
    assert is_services_network("container:thundersync-0123456789ab-net")
