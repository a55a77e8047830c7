"""OutputCapture keeps what truncate_output would keep, without holding the whole stream."""

from __future__ import annotations

import http.client
import os
import socket
import time
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from environments.sandboxes.capture import OutputCapture, read_docker_frames_until, read_fd_until
from environments.sandboxes.protocol import truncate_output


@given(
    data=st.binary(max_size=400),
    limit=st.integers(min_value=2, max_value=120),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_capture_equals_truncate_output_for_any_chunking(
    data: bytes, limit: int, cuts: list[int]
) -> None:
    capture = OutputCapture(limit)
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    for start, end in zip(bounds, bounds[1:], strict=False):
        capture.feed(data[start:end])
    assert capture.text() == truncate_output(data, limit)
    assert capture.num_bytes == len(data)


@pytest.mark.parametrize("limit", [0, 1])
def test_a_limit_below_two_keeps_no_output_but_the_marker(limit: int) -> None:
    capture = OutputCapture(limit)
    capture.feed(b"abc")
    text, truncated = capture.text()
    assert truncated and text.startswith("\n[... output truncated: 3 bytes") and "abc" not in text


def test_short_output_comes_back_verbatim() -> None:
    capture = OutputCapture(100)
    capture.feed(b"hello ")
    capture.feed(b"world\n")
    assert capture.text() == ("hello world\n", False)


def test_long_output_keeps_head_tail_and_counts_the_rest() -> None:
    capture = OutputCapture(10)
    for _ in range(1000):
        capture.feed(b"0123456789" * 100)
    text, truncated = capture.text()
    assert truncated
    assert text.startswith("01234\n[... output truncated: 999990 bytes omitted")
    assert text.endswith("56789")


def test_negative_limit_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_output_bytes"):
        OutputCapture(-1)


def test_read_fd_until_returns_at_end_of_file() -> None:
    r, w = os.pipe()
    os.write(w, b"abc")
    os.close(w)
    capture = OutputCapture(100)
    try:
        assert read_fd_until(r, capture, time.monotonic() + 5)
    finally:
        os.close(r)
    assert capture.text() == ("abc", False)


@pytest.mark.serial  # bounds the time past the deadline
def test_read_fd_until_stops_at_the_deadline_when_the_writer_stays_open() -> None:
    r, w = os.pipe()
    capture = OutputCapture(100)
    start = time.monotonic()
    try:
        assert not read_fd_until(r, capture, start + 0.3)
    finally:
        os.close(r)
        os.close(w)
    assert 0.3 <= time.monotonic() - start < 1.0


def test_docker_frames_read_with_the_upgrade_headers_are_not_lost() -> None:
    """docker-py hands back the socket below the HTTP response's buffered reader; a short
    command's frames that came with the ``101`` headers sat in that buffer, and reading the
    socket alone lost them: under load, 17 to 25 of 1,000 ``cat`` execs came back empty
    (2026-12-08)."""
    ours, daemons = socket.socketpair()
    frame = b"\x01\x00\x00\x00" + (2).to_bytes(4, "big") + b"1\n"
    daemons.sendall(
        b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n" + frame * 2
    )
    daemons.close()
    response = http.client.HTTPResponse(ours)
    response.begin()  # reads past the headers, as the SDK's request does
    sock = response.fp.raw  # what ``exec_start(socket=True)`` returns, its response kept on it
    sock._response = SimpleNamespace(raw=SimpleNamespace(_fp=response))
    capture = OutputCapture(1024)
    try:
        assert read_docker_frames_until(sock, capture, time.monotonic() + 5)
    finally:
        ours.close()
    assert capture.text() == ("1\n1\n", False)
