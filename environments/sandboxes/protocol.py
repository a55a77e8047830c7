"""The sandbox protocol: run one shell command at a time in an isolated workspace."""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
TRUNCATION_MARKER = "\n[... output truncated: {omitted} bytes omitted ...]\n"
MAX_FILE_BYTES = 256 * 1024 * 1024
"""The largest file a sandboxed command may write (``RLIMIT_FSIZE``), in either sandbox."""
MAX_EXPORT_BYTES = 2 * 1024 * 1024 * 1024
"""The most file data ``Sandbox.export_folder`` archives (sparse files count at their full
size, as an archive holds them): past it, ``ExportTooLarge``. A sandbox's own disk is smaller;
only sparse files or a disk-less sandbox reach it, and the host must not hold their bytes."""
MAX_ARGV_CMD_BYTES = 64 * 1024
"""Longer commands are sourced from a file or memfd (one argv string is at most 128 KiB)."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, died, lost its files): an infrastructure
    failure, never the agent's fault; episodes that hit it are flagged ``infra_failure``."""


class AgentBrokeSandbox(Exception):  # noqa: N818 (a failure, not an error of the harness)
    """The sandbox engine works, but what the agent did inside the sandbox stops it from
    running commands (its main program, shell or tools replaced or deleted). Deliberately not
    a SandboxError: who failed decides the label, and this is the agent's failure, which
    scores 0 with ``details["agent_failure"]`` (docs/design.md §6), never an excluded
    infrastructure failure."""


class ExportTooLarge(Exception):  # noqa: N818 (the agent's folder, not the harness, failed)
    """The folder to export holds more than ``MAX_EXPORT_BYTES``: what the agent left, not an
    infrastructure failure."""


class NeedsDockerError(SandboxError):
    """The sandbox engine cannot do what the task needs (``SandboxEngine.refuse``): a build
    step or an image that only the Docker sandbox provides, under bubblewrap."""


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
class ServiceSpec:
    """One more container beside the sandbox's own (a compose file's service other than
    ``main``), on a network of the sandbox's own with no route out, reached by ``name``.

    ``build_context`` (a folder with a Dockerfile) or ``image``; ``command``, ``entrypoint``,
    ``working_dir`` and ``user`` replace the image's; ``healthcheck`` (a shell command, exit 0
    = healthy) is waited for, at most ``start_timeout_s``, before the containers after it
    start; limits as the sandbox's.
    """

    name: str
    image: str | None = None
    build_context: Path | None = None
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    working_dir: str | None = None
    user: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    healthcheck: str | None = None
    start_timeout_s: float = 60.0
    memory_mb: int = 2048
    cpus: float = 1.0
    pids: int = 256


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """How to make a sandbox for one task.

    ``image``: a Docker image (ignored by bubblewrap); ``build_context``: a folder with a
    Dockerfile to build instead of ``image`` (bubblewrap raises NeedsDockerError);
    ``files``: host folder copied into ``workdir`` before the episode;
    limits apply to every command.

    ``disk_mb`` bounds the workspace (``workdir``): it lies on a disk of its own of that
    size (``disk.py``: a sparse, loop-mounted ext4 image, so only what is written takes host
    disk), so a command that fills it fails with ENOSPC, its own doing, while other sandboxes
    and the host are untouched. Docker keeps the image's own ``workdir`` content (copied onto
    the disk when the container is made), so the disk must hold it too. None: no bound (each
    file is still bounded by the file size limit); likewise, with a warning, where disks
    cannot be made (they need root and loop devices, and for Docker a daemon on this host).

    ``services``: more containers, started in this order before the sandbox's own (which
    other services reach as ``main``); only an engine that ``RUNS_MULTI_CONTAINER`` makes them.
    ``network``: join another sandbox's services instead (its ``services_network``), as they
    are: strict grading's fresh sandbox of a compose task sees the state the agent left them in.
    """

    image: str | None = None
    build_context: Path | None = None
    files: Path | None = None
    workdir: str = "/workspace"
    memory_mb: int = 2048
    cpus: float = 1.0
    pids: int = 256
    disk_mb: int | None = 4096
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    env: dict[str, str] = field(default_factory=dict)
    services: tuple[ServiceSpec, ...] = ()
    network: str | None = None


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

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        """Write a tar archive of folder ``path`` to host file ``dst``, made by the sandbox
        engine from outside the sandbox (Docker's archive API; bubblewrap's host reading the
        workspace), never by a program inside it that the agent could have replaced. Members
        are named ``<basename of path>/...``, the folder itself ``<basename>``, as Docker's
        archive API names them; links are stored as links, never followed. ``exclude`` names
        children of the folder (``.git``) left out, with all they hold. FileNotFoundError
        when ``path`` is missing, NotADirectoryError when it is not a folder (a link to one
        included), PermissionError when it cannot be read; SandboxError when the engine fails."""
        ...

    def stop_processes(self) -> None:
        """Kill every process in the sandbox from outside it (the engine, never a program in
        it); files persist and the next ``execute`` works as before. Grading calls it once
        the agent's last command has ended, so nothing the agent started outlives its turn."""
        ...

    def close(self) -> None:
        """Stop every process and remove the sandbox; safe to call twice, and from another
        thread: an ``execute`` running meanwhile has its command killed and raises
        SandboxError promptly. A sandbox that could not be removed raises SandboxError (on
        every call, so whoever closes it last still hears of it)."""
        ...


@runtime_checkable
class HasServices(Protocol):
    """A sandbox with ``SandboxSpec.services`` beside it (Docker's, ``compose.py``) also gives
    each service's container as a sandbox, for Harbor's collection phase (a sidecar's
    ``[[verifier.collect]]`` hooks and ``artifacts``): ``execute`` runs ``sh -c`` there,
    ``download`` and ``export_folder`` read it through the engine; nothing is uploaded."""

    def service(self, name: str) -> Sandbox | None:
        """Service ``name``'s container, or None when there is no such service."""
        ...

    def check_services(self, until: float | None = None) -> None:
        """An error quoting its last log lines when a service has exited since the episode
        began (before ``until``, a ``time.time()``, where given): ``AgentBrokeSandbox`` where it
        exited by itself (the agent's requests reach it: scored 0, never excluded), a
        SandboxError where the engine failed it. Grading asks before the verifier
        (``stop_processes``) and again after it, until the verifier began: a service that died
        in the agent's turn but that its engine still reported running makes the grade one of
        a verifier that could not reach it; one that died while the verifier ran, the verifier
        saw (docs/design.md §6)."""
        ...


def bash_read_whole(path: str) -> str:
    """The command that runs the bash script at ``path`` read whole before its first line runs
    (``bash -c '. "$0"' PATH``: ``source`` reads the file into memory, ``$0`` and
    ``BASH_SOURCE`` are the script's path). ``bash PATH`` reads the file as it goes, so code the
    script runs (the agent's, under test) could append lines that then run as the grader's:
    a forged reward after a failed test run (docs/grading.md). The one difference from ``bash
    PATH``: a ``return`` outside a function ends the script instead of failing."""
    return f"bash -c '. \"$0\"' {shlex.quote(path)}"


GRADER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The ``PATH`` of the grader's own commands (``own``): the system folders only."""


def own(command: str) -> str:
    """``command`` as the grader runs it in a sandbox the agent has worked in: with
    ``GRADER_PATH``, so an image whose ``PATH`` starts in the work folder (``/app/.venv/bin``
    is common) never runs the agent's ``tail`` or ``mkdir`` in place of the system's. Strict
    grading read its witness's records through them: a planted ``tail`` forged a proof of pass
    (test_reward_hacks_path). The verifier's own script keeps the task's ``PATH``
    (strict pins it: ``strict.pinned_environment``)."""
    return f"PATH={GRADER_PATH}; {command}"


MAX_SIZE_DIGITS = 18
"""The most digits of a byte count a sandbox's command may print (``parse_size``)."""


def parse_size(text: str) -> int | None:
    """A byte count a command in a sandbox printed (``stat -c %s``, ``wc -c``), or None where
    the text is not ASCII digits, at most ``MAX_SIZE_DIGITS`` of them. Once the agent's code
    has run in a sandbox, ``stat`` may be its own (a root agent in Docker): '²' passes
    ``str.isdigit`` and fails ``int``, and 5,000 digits fail ``int`` past Python's digit
    limit; raised, either made the attempt an infrastructure failure (red team, 2026-12-07)."""
    text = text.strip()
    if text.isascii() and text.isdigit() and len(text) <= MAX_SIZE_DIGITS:
        return int(text)
    return None


class GraderSetupError(Exception):
    """A grader preparation command ran but failed because of the state the agent left the
    sandbox in (a read-only workspace, deleted tools...): the episode scores 0. Only a
    SandboxError (the sandbox could not run a command at all) is an infrastructure failure;
    otherwise an agent could turn its own failure into an episode that is never trained on."""


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
