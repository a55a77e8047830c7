"""The sandbox protocol: run one shell command at a time in an isolated workspace."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
TRUNCATION_MARKER = "\n[... output truncated: {omitted} bytes omitted ...]\n"


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, died, lost its files): an infrastructure
    failure, never the agent's fault; episodes that hit it are flagged ``infra_failure``."""


class NeedsDockerError(SandboxError):
    """The task needs a build step or image that only the Docker sandbox provides."""


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What one ``execute`` call returned.

    ``output`` is stdout and stderr interleaved as text (undecodable bytes replaced),
    truncated to the sandbox's output limit with ``TRUNCATION_MARKER`` in the middle.
    ``exit_code`` is None when the command was killed by its timeout.
    """

    output: str
    exit_code: int | None
    timed_out: bool
    duration_s: float
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """How to make a sandbox for one task.

    ``image``: a Docker image (ignored by bubblewrap); ``build_context``: a folder with a
    Dockerfile to build instead of ``image`` (bubblewrap raises NeedsDockerError);
    ``files``: host folder copied into ``workdir`` before the episode;
    limits apply to every command.
    """

    image: str | None = None
    build_context: Path | None = None
    files: Path | None = None
    workdir: str = "/workspace"
    memory_mb: int = 2048
    cpus: float = 1.0
    pids: int = 256
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    env: dict[str, str] = field(default_factory=dict)


class Sandbox(Protocol):
    """An isolated workspace. Implementations don't inherit this; they match it.

    Stateless per call (like mini-swe-agent's ``execute``): each command runs in a fresh
    shell started in ``workdir``; files persist between calls, shell state does not.
    """

    workdir: str

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        """Run ``cmd`` with ``bash -c``; kill its whole process tree after ``timeout`` s."""
        ...

    def upload(self, src: Path, dst: str) -> None:
        """Copy a host file or folder to ``dst`` inside the sandbox."""
        ...

    def download(self, src: str, dst: Path) -> None:
        """Copy a file or folder from the sandbox to the host."""
        ...

    def close(self) -> None:
        """Stop every process and remove the sandbox; safe to call twice."""
        ...


def truncate_output(data: bytes, limit: int) -> tuple[str, bool]:
    """Keep the head and tail of ``data`` within ``limit`` bytes, with a marker between."""
    if len(data) <= limit:
        return data.decode("utf-8", errors="replace"), False
    half = limit // 2
    marker = TRUNCATION_MARKER.format(omitted=len(data) - 2 * half)
    head = data[:half].decode("utf-8", "replace")
    tail = data[len(data) - half :].decode("utf-8", "replace")
    text = head + marker + tail
    return text, True
