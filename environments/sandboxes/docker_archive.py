"""Files in and out of a Docker sandbox's container through the daemon's archive API
(``put_archive``, ``get_archive``): no program runs in the container for them, and every
failure of the daemon is a SandboxError naming the container (``marker``)."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Collection
from pathlib import Path
from typing import Any

from environments.sandboxes import tar_stream
from environments.sandboxes.protocol import MAX_EXPORT_BYTES, ExportTooLarge, SandboxError

GO_MODE_DIR = 1 << 31  # os.ModeDir in the stat header of Docker's archive API
GO_MODE_SYMLINK = 1 << 27  # os.ModeSymlink


def put(client: Any, container: Any, marker: str, src: Path, dst: str) -> None:
    """Unpack host ``src`` as container path ``dst`` (a folder's contents merge into an
    existing folder)."""
    if not os.path.lexists(src):
        raise FileNotFoundError(f"upload source {src} does not exist")
    dst = posixpath.normpath(dst)
    if not src.is_dir() and _is_dir(client, container, marker, dst):
        raise IsADirectoryError(f"upload of file {src} onto folder {dst}: name the new file")
    with tar_stream.archive_of(src, dst) as buf:
        try:
            ok = container.put_archive("/", buf)
        except Exception as exc:
            raise SandboxError(f"container {marker}: upload to {dst} failed: {exc}") from exc
    if not ok:
        raise SandboxError(f"container {marker}: upload to {dst} was refused")


def put_bytes(container: Any, marker: str, data: bytes, path: str) -> None:
    try:
        container.put_archive("/", tar_stream.archive_of_bytes(data, path))
    except Exception as exc:
        raise SandboxError(f"container {marker}: cannot write {path}: {exc}") from exc


def _is_dir(client: Any, container: Any, marker: str, path: str) -> bool:
    try:
        stream, stat = client.api.get_archive(container.id, path)
    except Exception as exc:
        if type(exc).__name__ == "NotFound":
            return False  # missing: the upload creates it
        raise SandboxError(f"container {marker}: cannot inspect {path}: {exc}") from exc
    stream.close()
    return bool(stat.get("mode", 0) & GO_MODE_DIR)


def get(container: Any, marker: str, path: str, dst: Path) -> None:
    """Copy container path ``path`` to host path ``dst`` (its full new name), unpacked with
    tarfile's ``data`` filter (``tar_stream.extract_one``)."""
    try:
        stream, _ = container.get_archive(path)
    except Exception as exc:
        if type(exc).__name__ == "NotFound":
            raise FileNotFoundError(f"download source {path} not found in {marker}") from exc
        raise SandboxError(f"container {marker}: download of {path}: {exc}") from exc
    try:
        tar_stream.extract_one(stream, dst)
    except tar_stream.StreamError as exc:
        raise SandboxError(f"container {marker}: download of {path}: {exc.__cause__}") from exc


def export(
    client: Any, container: Any, marker: str, full: str, dst: Path, exclude: Collection[str]
) -> None:
    """Archive container folder ``full`` to host ``dst``, ``exclude``'s members dropped as
    the archive streams past."""
    try:
        stream, stat = client.api.get_archive(container.id, full)
    except Exception as exc:
        if type(exc).__name__ == "NotFound":
            raise FileNotFoundError(f"{full} not found in {marker}") from exc
        raise SandboxError(f"container {marker}: archive of {full}: {exc}") from exc
    try:
        mode = int(stat.get("mode", 0))
        if mode & GO_MODE_SYMLINK or not mode & GO_MODE_DIR:
            target = stat.get("linkTarget") or ""
            raise NotADirectoryError(f"{full} is not a folder in {marker} {target}")
        chunks = _capped(stream, full)
        if exclude:
            top = posixpath.basename(full) or "."
            tar_stream.copy_without(chunks, top, frozenset(exclude), dst)
        else:
            with open(dst, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
    except (OSError, ExportTooLarge):
        raise
    except Exception as exc:
        raise SandboxError(f"container {marker}: archive of {full}: {exc}") from exc
    finally:
        stream.close()


def _capped(chunks: Any, full: str) -> Any:
    """The daemon's archive stream, ended with ExportTooLarge past ``MAX_EXPORT_BYTES`` (a
    sparse file streams at its full size)."""
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > MAX_EXPORT_BYTES:
            raise ExportTooLarge(f"{full} holds over {MAX_EXPORT_BYTES} bytes of file data")
        yield chunk
