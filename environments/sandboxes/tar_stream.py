"""Tar archives to and from the Docker daemon's archive API (``put_archive``, ``get_archive``),
which moves files in and out of a container without running a program in it
(``DockerSandbox.upload``, ``download``, ``export_folder``)."""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


class StreamError(Exception):
    """Reading the daemon's stream failed (its ``__cause__`` says why)."""


@contextmanager
def archive_of(src: Path, dst: str) -> Iterator[IO[bytes]]:
    """A tar (in a temporary file, rewound) holding ``src`` as container path ``dst``."""
    with tempfile.TemporaryFile() as buf:
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(src, arcname=dst.lstrip("/") or ".")
        buf.seek(0)
        yield buf


def archive_of_bytes(data: bytes, path: str) -> bytes:
    """A tar holding one file, ``data`` at container path ``path``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def extract_one(chunks: Iterable[bytes], dst: Path) -> None:
    """Unpack the archive of one file or folder (the daemon's stream of byte chunks) as
    ``dst`` (a folder's contents merge into an existing folder); members that would land
    outside it are refused (tarfile's ``data`` filter)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tempfile.TemporaryFile() as buf:
            try:
                for chunk in chunks:
                    buf.write(chunk)
            except Exception as exc:
                raise StreamError("the stream broke") from exc
            buf.seek(0)
            with tarfile.open(fileobj=buf, mode="r") as tar:
                tar.extractall(tmp, filter="data")
        (item,) = Path(tmp).iterdir()
        if item.is_dir() and dst.is_dir():
            shutil.copytree(item, dst, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.move(str(item), dst)


def copy_without(chunks: Iterable[bytes], top: str, exclude: frozenset[str], dst: Path) -> None:
    """Copy the tar streaming as ``chunks`` to ``dst`` without the members below ``top``
    named in ``exclude`` (read past, never stored)."""
    reader = io.BufferedReader(_ChunkReader(chunks), buffer_size=1 << 20)
    with (
        tarfile.open(fileobj=reader, mode="r|") as archive,
        tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as out,
    ):
        for member in archive:
            parts = member.name.lstrip("/").split("/")
            if len(parts) > 1 and parts[0] == top and parts[1] in exclude:
                continue
            out.addfile(member, archive.extractfile(member) if member.isreg() else None)


class _ChunkReader(io.RawIOBase):
    """An iterator of byte chunks as a readable file."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks, self._pending = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size], self._pending = self._pending[:size], self._pending[size:]
        return size
