"""Sandboxes: run an agent's shell commands in isolation (bubblewrap or Docker)."""

from __future__ import annotations

from environments.sandboxes.bwrap import BwrapSandbox
from environments.sandboxes.docker import BASE_IMAGE, DockerSandbox
from environments.sandboxes.docker_daemon import docker_available
from environments.sandboxes.pool import SandboxPool
from environments.sandboxes.protocol import (
    AgentBrokeSandbox,
    ExecResult,
    NeedsDockerError,
    Sandbox,
    SandboxError,
    SandboxSpec,
    truncate_output,
)

SANDBOX_KINDS = ("bwrap", "docker")


def make_sandbox(spec: SandboxSpec, kind: str = "bwrap") -> Sandbox:
    """A new sandbox of ``kind`` ("bwrap" or "docker") for ``spec``; the caller closes it."""
    if kind == "bwrap":
        return BwrapSandbox(spec)
    if kind == "docker":
        return DockerSandbox(spec)
    raise ValueError(f"unknown sandbox kind {kind!r}; expected one of {SANDBOX_KINDS}")


__all__ = [
    "BASE_IMAGE",
    "AgentBrokeSandbox",
    "SANDBOX_KINDS",
    "BwrapSandbox",
    "DockerSandbox",
    "ExecResult",
    "NeedsDockerError",
    "Sandbox",
    "SandboxError",
    "SandboxPool",
    "SandboxSpec",
    "docker_available",
    "make_sandbox",
    "truncate_output",
]
