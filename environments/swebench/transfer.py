"""Move text files in and out of a sandbox with ``execute`` alone, in base64 chunks.

Grading needs the whole test log, but ``execute`` truncates its output and ``bash -c`` caps
one argument at 128 KiB; and a sandbox may keep files only in its workspace. Chunked base64
through ``execute`` works in any sandbox that has ``base64`` and keeps its workspace files.

Two failures are told apart: the engine failing to run a command (``execute`` raises
SandboxError) and a command that ran and failed (``CommandFailed``, a SandboxError too: a file
missing, a tool that exits non-zero, bad output). Once the agent's code has run in a sandbox,
the second may be the agent's doing, and a caller reading what that code could reach (an eval
log) decides the label itself (docs/design.md §6.1, principle 3).
"""

from __future__ import annotations

import base64
import shlex

from environments.sandboxes.protocol import ExecResult, Sandbox, SandboxError, parse_size

WRITE_CHUNK_BYTES = 48 * 1024
MAX_READ_BYTES = 64 * 1024 * 1024
MIN_READ_CHUNK_BYTES = 512


class CommandFailed(SandboxError):
    """A transfer's command ran in the sandbox and failed (its exit status, a timeout, output
    cut or not base64, a file missing or shrinking): unlike a SandboxError the engine raises,
    a failure the sandbox's own state caused."""


def write_text(sandbox: Sandbox, path: str, text: str, *, timeout: float = 60.0) -> None:
    """Write ``text`` to ``path`` inside the sandbox, creating its folder."""
    write_bytes(sandbox, path, text.encode(), timeout=timeout)


def write_bytes(sandbox: Sandbox, path: str, data: bytes, *, timeout: float = 60.0) -> None:
    """Write ``data`` to ``path`` inside the sandbox, creating its folder."""
    quoted = shlex.quote(path)
    for start in range(0, max(len(data), 1), WRITE_CHUNK_BYTES):
        chunk = base64.b64encode(data[start : start + WRITE_CHUNK_BYTES]).decode()
        if start == 0:  # the folder made with the first chunk: one command for most files
            cmd = f'mkdir -p "$(dirname {quoted})" && printf %s {chunk} | base64 -d > {quoted}'
        else:
            cmd = f"printf %s {chunk} | base64 -d >> {quoted}"
        _run(sandbox, cmd, timeout)


def read_text(sandbox: Sandbox, path: str, *, chunk_bytes: int, timeout: float = 60.0) -> str:
    """Read ``path`` from the sandbox as UTF-8 (undecodable bytes replaced); see read_bytes."""
    data = read_bytes(sandbox, path, chunk_bytes=chunk_bytes, timeout=timeout)
    return data.decode("utf-8", errors="replace")


def file_size(sandbox: Sandbox, path: str, *, timeout: float = 60.0) -> int:
    """The size of ``path`` in the sandbox (CommandFailed when it cannot be stat'ed)."""
    size_text = _run(sandbox, f"stat -c %s {shlex.quote(path)}", timeout)
    size = parse_size(size_text)
    if size is None:
        raise CommandFailed(f"cannot stat {path} in the sandbox: {size_text[:200]!r}")
    return size


def read_bytes(
    sandbox: Sandbox, path: str, *, chunk_bytes: int, timeout: float = 60.0, start: int = 0
) -> bytes:
    """Read ``path`` from the sandbox from byte ``start`` to its end (at most
    ``MAX_READ_BYTES``: a larger read raises CommandFailed; read a tail with ``start``).
    ``chunk_bytes`` should keep one chunk's base64 (4/3 of it) under the sandbox's output
    limit; a truncated chunk is retried at half the size. The file's size comes with its
    first chunk: a file of one chunk takes one command (a Docker exec costs ~60 ms)."""
    quoted = shlex.quote(path)
    start, size = max(0, start), None
    data = bytearray()
    while size is None or start + len(data) < size:
        cmd = f"tail -c +{start + len(data) + 1} {quoted} | head -c {chunk_bytes} | base64 -w0"
        if size is None:  # nothing read past the size stat gives (a fifo's 0: no blocking read)
            cmd = f's=$(stat -c %s {quoted}) && echo "$s" && {{ [ "$s" -le {start} ] || {cmd}; }}'
        result = sandbox.execute(cmd, timeout=timeout)
        if result.truncated and chunk_bytes > MIN_READ_CHUNK_BYTES:
            chunk_bytes //= 2
            continue
        try:
            encoded = _checked(result, cmd)
        except CommandFailed as exc:
            if size is None:
                raise CommandFailed(f"cannot stat or read {path} in the sandbox: {exc}") from exc
            raise
        if size is None:
            size_text, _, encoded = encoded.partition("\n")
            size = parse_size(size_text)
            if size is None:
                raise CommandFailed(f"cannot stat {path} in the sandbox: {size_text[:200]!r}")
            start = min(start, size)
            if size - start > MAX_READ_BYTES:
                raise CommandFailed(
                    f"{path} in the sandbox is {size} bytes, over {MAX_READ_BYTES} from byte "
                    f"{start}"
                )
            if start == size:
                break
        try:
            chunk = base64.b64decode(encoded.strip(), validate=True)
        except ValueError as exc:
            raise CommandFailed(f"reading {path} from the sandbox: bad base64 chunk") from exc
        if not chunk:
            raise CommandFailed(f"{path} in the sandbox shrank while being read")
        data += chunk
    return bytes(data)


def _run(sandbox: Sandbox, cmd: str, timeout: float) -> str:
    return _checked(sandbox.execute(cmd, timeout=timeout), cmd)


def _checked(result: ExecResult, cmd: str) -> str:
    if result.timed_out or result.exit_code != 0 or result.truncated:
        raise CommandFailed(
            f"sandbox command failed (exit {result.exit_code}, timed out {result.timed_out}, "
            f"truncated {result.truncated}): {cmd[:120]!r}: {result.output[-500:]!r}"
        )
    return result.output
