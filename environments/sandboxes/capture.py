"""Bounded capture of a command's output: head and tail kept, the middle counted and dropped."""

from __future__ import annotations

import os
import select
import time
from typing import Any

from environments.sandboxes.protocol import TRUNCATION_MARKER, truncate_output

READ_CHUNK_BYTES = 64 * 1024


class OutputCapture:
    """Keeps at most ``limit`` + ``limit // 2`` bytes however much is fed.

    ``text()`` equals ``truncate_output(all_bytes, limit)`` without holding ``all_bytes``:
    the first ``limit`` bytes are kept whole (so short outputs come back verbatim), and past
    that only a rolling tail of ``limit // 2`` bytes.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"max_output_bytes must be >= 0, got {limit}")
        self.limit = limit
        self.num_bytes = 0
        self._head = bytearray()
        self._tail = bytearray()

    def feed(self, chunk: bytes) -> None:
        self.num_bytes += len(chunk)
        room = self.limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
        half = self.limit // 2
        if half == 0:
            return
        self._tail += chunk[-half:]
        if len(self._tail) > half:
            del self._tail[: len(self._tail) - half]

    def text(self) -> tuple[str, bool]:
        """The captured output as text and whether it was truncated."""
        if self.num_bytes <= self.limit:
            return truncate_output(bytes(self._head), self.limit)
        half = self.limit // 2
        marker = TRUNCATION_MARKER.format(omitted=self.num_bytes - 2 * half)
        head = bytes(self._head[:half]).decode("utf-8", "replace")
        return head + marker + bytes(self._tail).decode("utf-8", "replace"), True


def readable(fds: list[int], seconds: float) -> list[int]:
    """The descriptors of ``fds`` readable (or at their end) within ``seconds``. ``poll``, not
    ``select``: a process with many sandboxes open holds descriptors numbered past
    ``select``'s limit of 1024 (a bwrap session's pipes live as long as its sandbox)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(seconds * 1000)]


def read_fd_until(fd: int, capture: OutputCapture, deadline: float) -> bool:
    """Feed ``capture`` from ``fd`` (blocking or not) until end of file (True) or
    ``deadline`` (False).

    ``deadline`` is on the ``time.monotonic`` clock; reading never blocks past it.
    """
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if not readable([fd], min(remaining, 0.25)):
            continue
        try:
            chunk = os.read(fd, READ_CHUNK_BYTES)
        except BlockingIOError:
            continue
        if not chunk:
            return True
        capture.feed(chunk)


def read_docker_frames_until(sock: Any, capture: OutputCapture, deadline: float) -> bool:
    """Demultiplex Docker's framed exec stream into ``capture`` until EOF (True) or deadline:
    first what the HTTP client already read past the response's headers (``_buffered``),
    then the socket."""
    raw = getattr(sock, "_sock", sock)
    pending = b""
    need = 0  # payload bytes left in the current frame
    chunk = _buffered(sock)
    while True:
        data = pending + chunk
        pending = b""
        while data:
            if need:
                capture.feed(data[:need])
                taken = min(need, len(data))
                need -= taken
                data = data[taken:]
            elif len(data) < 8:
                pending = data
                break
            else:
                need = int.from_bytes(data[4:8], "big")
                data = data[8:]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        chunk = b""
        if readable([raw.fileno()], min(remaining, 0.25)):
            chunk = raw.recv(READ_CHUNK_BYTES)
            if not chunk:
                return True


def _buffered(sock: Any) -> bytes:
    """The stream's bytes the HTTP client read past the response's headers into its buffer,
    which a read from the socket never sees: docker-py hands back the socket below the
    response's buffered reader (``response.raw._fp.fp``), and where the exec's output came
    with the headers (a short command on a loaded machine) it was lost. Under load, 4 of
    1,000 execs came back empty or short this way (``cat reward.txt``: a reward of 0 for a
    passing run; the witness's records taken for removed: 2026-12-08)."""
    reader = getattr(getattr(getattr(sock, "_response", None), "raw", None), "_fp", None)
    buffered, raw = getattr(reader, "fp", None), getattr(sock, "_sock", None)
    if buffered is None or not hasattr(buffered, "read1") or raw is None:
        return b""
    timeout = raw.gettimeout()
    raw.setblocking(False)  # the buffer's bytes, or what the socket holds now: never a wait
    try:
        return buffered.read1(READ_CHUNK_BYTES) or b""
    except OSError:
        return b""
    finally:
        raw.settimeout(timeout)
