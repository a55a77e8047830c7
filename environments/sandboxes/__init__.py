"""Sandboxes: run an agent's shell commands in isolation (bubblewrap or Docker), each kind a
registered engine (``engines.py``)."""

from __future__ import annotations

from environments.sandboxes.bwrap import BwrapSandbox
from environments.sandboxes.docker import BASE_IMAGE, DockerSandbox
from environments.sandboxes.docker_daemon import docker_available
from environments.sandboxes.engines import (
    CAPABILITIES,
    ENGINES,
    SandboxEngine,
    UnknownEngine,
    engine_names,
    sandbox_engine,
)
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

SANDBOX_KINDS = tuple(ENGINES)
"""The built-in engines' names (``engine_names()`` adds those of installed packages)."""


def make_sandbox(spec: SandboxSpec, kind: str = "bwrap") -> Sandbox:
    """A new sandbox of engine ``kind`` (``engines.py``) for ``spec``; the caller closes it.
    An unknown kind raises UnknownEngine (a ValueError) naming the known ones."""
    return sandbox_engine(kind).make(spec)


__all__ = [
    "BASE_IMAGE",
    "AgentBrokeSandbox",
    "CAPABILITIES",
    "ENGINES",
    "SANDBOX_KINDS",
    "BwrapSandbox",
    "DockerSandbox",
    "ExecResult",
    "NeedsDockerError",
    "Sandbox",
    "SandboxEngine",
    "SandboxError",
    "SandboxPool",
    "SandboxSpec",
    "UnknownEngine",
    "docker_available",
    "engine_names",
    "make_sandbox",
    "sandbox_engine",
    "truncate_output",
]
