"""The agent's work folder as an archive: taken out of one sandbox, compared, put into another.

Strict grading (docs/design.md §6) grades in a fresh sandbox that receives only the agent's
work folder (the task's WORKDIR). ``export_work`` has the sandbox engine archive that folder
(``Sandbox.export_folder``: Docker's archive API, bubblewrap's host reading the workspace), so
no program in the episode's sandbox, which the agent could have replaced, takes part. On the
host the archive is read member by member into a clean archive that holds only folders,
regular files (hard links become copies) and symbolic links, with set-id bits dropped and no
absolute or ``..`` names; an archive no real folder gives (a name twice, a member below a link
or a file, which unpacking would write through the link) is refused. ``link_reasons`` reports
the agent's links that lead out of the work folder. ``import_work`` empties the fresh
sandbox's work folder and unpacks the clean archive there with the fresh sandbox's own ``tar``
(a clean sandbox, made from the task).

``WorkTree.changed_since`` lists what the agent added, changed or deleted relative to the work
folder of a fresh sandbox (the task's pristine state), which is what tamper detection judges.
"""

from __future__ import annotations

import errno
import hashlib
import io
import posixpath
import shlex
import tarfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from environments.sandboxes.protocol import MAX_EXPORT_BYTES, ExportTooLarge, Sandbox, SandboxError

ARCHIVE_NAME = "work.tar"
OWN_PREFIX = ".thundersync-"
"""Top-level names of the project's own markers in a work folder; never part of the work."""


def scratch_folders(workdir: str) -> tuple[str, str]:
    """Where an archive is made in a sandbox: /logs first, outside the work folder (so grading
    in the episode's own sandbox sees no trace of it; bubblewrap binds /logs, while its /tmp
    lasts one command), else a folder of the project's own in the work folder (left out of
    the archive and removed again)."""
    return "/logs/.thundersync-grader", f"{workdir.rstrip('/')}/{OWN_PREFIX}grader-work"


TIMEOUT_S = 300.0
CACHE_FOLDER = "__pycache__"
"""Left out of every clean archive: Python and pytest load a cached module from it when its
header matches the source's size and time (or hash), which the agent can forge for a pristine
source (``tests/__pycache__/test_calc.cpython-311-pytest-8.3.2.pyc`` compiled from a test that
passes). Caches are never work: grading compiles the sources again."""


_TREE_ERRORS = frozenset({errno.ENAMETOOLONG, errno.ELOOP})
"""Errors reading the work folder that its own names and links cause (24 nested folders of
200-character names pass the host's 4096-byte path limit): the agent's, not the host's."""


class WorkExportError(Exception):
    """The agent's work folder could not be archived in the state the agent left it (deleted,
    unreadable, over the sandbox's file-size limit): the attempt scores 0."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One member of a work folder: its kind (``file``, ``link``, ``dir``) and content."""

    kind: str
    digest: str
    """sha256 of a file's bytes, a link's target, or "" for a folder."""


@dataclass(frozen=True, slots=True)
class WorkTree:
    """A work folder's clean archive on the host and what it holds, by relative path."""

    archive: Path
    entries: dict[str, Entry]

    def read(self, path: str, limit: int = 1024 * 1024) -> str:
        """A regular file's text (at most ``limit`` bytes; "" when absent or not a file)."""
        return self.read_many([path], limit)[path]

    def read_many(self, paths: Collection[str], limit: int) -> dict[str, str]:
        """``read`` of each of ``paths``, the archive opened and scanned once (a read apiece
        rescans it, which thousands of small files made slow)."""
        wanted = {p for p in paths if self.entries.get(p, Entry("", "")).kind == "file"}
        texts = dict.fromkeys(paths, "")
        with tarfile.open(self.archive) as archive:
            for member in archive:
                if member.name in wanted and (handle := archive.extractfile(member)) is not None:
                    texts[member.name] = handle.read(limit).decode("utf-8", errors="replace")
        return texts

    def file_digest(self, path: str, workdir: str) -> str | None:
        """The sha256 of the file at ``path``, through links inside the folder (``workdir``:
        where it lies, for a link's absolute target; a few hops); None for no file there."""
        for _ in range(8):
            entry = self.entries.get(path)
            if entry is None or entry.kind != "link":
                return entry.digest if entry is not None and entry.kind == "file" else None
            target = posixpath.join("/", posixpath.dirname(path), entry.digest)
            if entry.digest.startswith("/"):  # absolute: inside the work folder, or not here
                target = posixpath.relpath(posixpath.normpath(entry.digest), workdir)
                if target.startswith(".."):
                    return None
            path = posixpath.normpath(target).lstrip("/")
        return None

    def changed_since(self, pristine: WorkTree) -> tuple[list[str], list[str]]:
        """(added or changed files and links, deleted files and links) relative to
        ``pristine``; folders themselves are not listed."""
        changed = [
            path
            for path, entry in sorted(self.entries.items())
            if entry.kind != "dir" and pristine.entries.get(path) != entry
        ]
        deleted = [
            path
            for path, entry in sorted(pristine.entries.items())
            if entry.kind != "dir" and path not in self.entries
        ]
        return changed, deleted


def export_work(
    sandbox: Sandbox,
    workdir: str,
    host_dir: Path,
    name: str,
    *,
    exclude: Collection[str] = (),
    max_entries: int | None = None,
) -> WorkTree:
    """Archive ``workdir`` through the sandbox engine (``Sandbox.export_folder``: no program
    of the sandbox, which the agent could have replaced, takes part), without its children
    named in ``exclude``, and read it into a clean archive ``host_dir/name``. WorkExportError
    when the agent left the folder missing, not a folder, unreadable, too large, too deep, or
    an archive that could not come from a real folder, or more than ``max_entries`` members;
    SandboxError when the engine (or the host) fails (``export_agent_folder``'s map)."""
    raw = host_dir / f"{name}.raw"
    export_agent_folder(sandbox, workdir, raw, exclude=exclude, what="the work folder")
    top = posixpath.basename(workdir.rstrip("/")) or "."
    try:
        return _clean(raw, host_dir / name, top=top, max_entries=max_entries)
    finally:
        raw.unlink(missing_ok=True)


def export_agent_folder(
    sandbox: Sandbox,
    path: str,
    dst: Path,
    *,
    exclude: Collection[str] = (),
    what: str = "the folder",
) -> None:
    """``sandbox.export_folder(path, dst, exclude=exclude)`` with the one error map for every
    export of state the agent could reach (a work folder, a repository's tree, its ``.git``):
    what the agent's files cause (the folder missing, not a folder, unreadable, over
    ``MAX_EXPORT_BYTES``, names or links past the host's limits) raises WorkExportError, its
    0; anything else the host or engine raises is SandboxError, an infrastructure failure.
    One map, so that the same thing the agent left cannot score 0 in one folder and exclude
    the episode from training in another."""
    try:
        sandbox.export_folder(path, dst, exclude=exclude)
    except (FileNotFoundError, NotADirectoryError, PermissionError, ExportTooLarge) as err:
        raise WorkExportError(f"cannot archive {what} {path}: {err}") from err
    except OSError as err:
        if err.errno in _TREE_ERRORS:  # names or links the agent made
            raise WorkExportError(f"cannot archive {what} {path}: {err}") from err
        raise SandboxError(f"cannot archive {what} {path}: {err}") from err


def import_work(sandbox: Sandbox, workdir: str, work: WorkTree) -> None:
    """Replace ``workdir`` in ``sandbox`` (a fresh one) by the clean archive's contents.
    WorkExportError when the fresh sandbox, made from the task, cannot hold or unpack the
    agent's work (too large for its disk, names too long): the agent's doing, scored 0;
    SandboxError when the sandbox fails."""
    w = shlex.quote(workdir)
    for scratch in scratch_folders(workdir):
        s = shlex.quote(scratch)
        made = f"mkdir -p {w} && rm -rf {s} && mkdir -p {s}"
        if sandbox.execute(made, timeout=TIMEOUT_S).exit_code != 0:
            continue
        upload_agents(sandbox, work.archive, f"{scratch}/{ARCHIVE_NAME}", what="the agent's work")
        archive = shlex.quote(f"{scratch}/{ARCHIVE_NAME}")
        done = sandbox.execute(
            f"find {w} -mindepth 1 -maxdepth 1 ! -name '{OWN_PREFIX}*' -exec rm -rf {{}} + && "
            f"tar --no-same-owner -C {w} -xf {archive}; rc=$?; rm -rf {s}; exit $rc",
            timeout=TIMEOUT_S,
        )
        if done.exit_code != 0:  # a fresh sandbox's own tar, on an archive the host wrote
            raise WorkExportError(
                f"the agent's work cannot be unpacked in a fresh sandbox: {done.output[-500:]}"
            )
        return
    raise SandboxError(f"no scratch folder ({', '.join(scratch_folders(workdir))}) in the sandbox")


_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def upload_agents(sandbox: Sandbox, host: Path, path: str, *, what: str) -> None:
    """``sandbox.upload(host, path)`` of what the agent left (its work, its artifacts) into a
    grading sandbox made from the task: a sandbox too small for it is the agent's doing
    (WorkExportError, its 0); any other failure is SandboxError, an infrastructure failure."""
    try:
        sandbox.upload(host, path)
    except OSError as err:
        if err.errno not in _NO_ROOM:
            raise SandboxError(f"uploading {what} failed: {err}") from err
        raise WorkExportError(f"{what} does not fit a fresh sandbox: {err}") from err


def _member_name(raw: str, top: str = ".") -> str | None:
    """The member's path relative to the work folder (whose own member is ``top``, "." or the
    folder's name); None for the folder itself, a name outside it or that leaves it, or one of
    the project's own markers."""
    if top != ".":
        if raw.rstrip("/") == top:
            return None
        if not raw.startswith(top + "/"):
            return None
        raw = raw[len(top) + 1 :] or "."
    name = posixpath.normpath(raw.lstrip("/")) if raw not in ("", ".", "./") else "."
    if name == "." or name == ".." or name.startswith("../") or raw.startswith("/"):
        return None
    if name.split("/", 1)[0].startswith(OWN_PREFIX):
        return None
    return name


def _clean(
    raw: Path,
    clean: Path,
    top: str = ".",
    limit: int = MAX_EXPORT_BYTES,
    max_entries: int | None = None,
) -> WorkTree:
    """Copy ``raw``'s folders, files and links into ``clean`` (but ``CACHE_FOLDER``s); index
    them. An archive that no real folder gives (a name twice, a member below a link or a file)
    is refused: extracted, it would write through the link (``zz -> tests`` then
    ``zz/test_calc.py``). A hard link becomes a copy of its file, so the copies' data counts
    against ``limit`` as the files' does: Docker's archive sends a link without data, and 250
    links to a 4 MB file made a 1 GB clean archive (red team, 2026-12-07); past ``limit`` it
    is the agent's WorkExportError, as an over-large folder is."""
    entries: dict[str, Entry] = {}
    total = 0
    try:
        with tarfile.open(raw) as source, tarfile.open(clean, "w") as target:
            kept = [
                (name, member)
                for member in source
                if (name := _member_name(member.name, top)) is not None
                and (member.isdir() or member.isfile() or member.issym() or member.islnk())
                and CACHE_FOLDER not in name.split("/")
            ]
            if max_entries is not None and len(kept) > max_entries:
                raise WorkExportError(f"the folder holds over {max_entries} files and folders")
            _check_structure(kept)
            for name, member in kept:
                copy = tarfile.TarInfo(name)
                copy.mode, copy.mtime = member.mode & 0o777, member.mtime
                if member.isdir():
                    copy.type = tarfile.DIRTYPE
                    target.addfile(copy)
                    entries[name] = Entry("dir", "")
                elif member.issym():
                    copy.type, copy.linkname = tarfile.SYMTYPE, member.linkname
                    target.addfile(copy)
                    entries[name] = Entry("link", member.linkname)
                else:  # a regular file, or a hard link read as the file it links to
                    handle, copy.size = _open_member(source, member)
                    total += copy.size
                    if total > limit:
                        raise WorkExportError(
                            f"the work folder holds over {limit} bytes of file data, "
                            "each hard link counted as the copy grading makes of it"
                        )
                    hashing = _Hashing(handle)
                    target.addfile(copy, hashing)
                    entries[name] = Entry("file", hashing.digest.hexdigest())
    except (tarfile.TarError, OSError, EOFError) as err:
        raise WorkExportError(f"the archive of the work folder is unreadable: {err}") from err
    return WorkTree(clean, entries)


def _check_structure(members: list[tuple[str, tarfile.TarInfo]]) -> None:
    """WorkExportError for a name given twice or a member below a link or a file."""
    kinds: dict[str, str] = {}
    for name, member in members:
        if name in kinds:
            raise WorkExportError(f"the work archive names {name!r} twice (a steered archive)")
        kinds[name] = "folder" if member.isdir() else "link" if member.issym() else "file"
    for name in kinds:
        parts = name.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if kinds.get(parent, "folder") != "folder":
                raise WorkExportError(
                    f"the work archive puts {name!r} below {parent!r}, a {kinds[parent]}: "
                    "unpacked, it would be written through it (a steered archive)"
                )


SYSTEM_LINK_ROOTS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"})
"""Outside the work folder, links may lead only into the system's program folders (a virtual
environment's ``bin/python -> /usr/bin/python3``), by a path without ``..``."""
MAX_LINK_FOLLOWS = 40  # as the kernel's ELOOP


def _resolve(path: str, work: WorkTree, workdir: str) -> str | None:
    """Where link ``path`` of ``work`` leads when, resolved as the kernel resolves it over the
    work tree, it leaves the work folder for anywhere but ``SYSTEM_LINK_ROOTS``; else None."""
    root = workdir.rstrip("/")
    current = path.split("/")[:-1]
    pending = work.entries[path].digest.split("/")
    if work.entries[path].digest.startswith("/"):
        pending, current = ["/", *pending[1:]], []
    follows = 0
    while pending:
        part = pending.pop(0)
        if part == "/":  # an absolute target: inside the work folder, or out
            full = "/" + "/".join(pending)
            if full == root or full.startswith(root + "/"):
                pending, current = full[len(root) :].split("/"), []
                continue
            parts = [p for p in pending if p not in ("", ".")]
            if parts and parts[0] in SYSTEM_LINK_ROOTS and ".." not in parts:
                return None
            return posixpath.normpath(full)
        if part in ("", "."):
            continue
        if part == "..":
            if not current:
                rest = "/".join(pending)
                return posixpath.normpath(posixpath.join(posixpath.dirname(root), rest))
            current.pop()
            continue
        entry = work.entries.get("/".join([*current, part]))
        if entry is not None and entry.kind == "link":
            follows += 1
            if follows > MAX_LINK_FOLLOWS:
                return None  # the kernel gives up (ELOOP): nothing is reached
            target = entry.digest.split("/")
            pending = [*(["/", *target[1:]] if entry.digest.startswith("/") else target), *pending]
            continue
        current.append(part)
    return None


def link_reasons(workdir: str, pristine: WorkTree, work: WorkTree) -> list[str]:
    """``"<path>: <reason>"`` for each link of the agent's work that leads out of the work
    folder (other than into the system's program folders, ``SYSTEM_LINK_ROOTS``) and is not
    the task's own: in the grading sandbox it would show the tests what the grader put there
    (``output.txt -> /tests/expected.txt``) or what the agent left outside its work."""
    reasons = []
    for path, entry in sorted(work.entries.items()):
        if entry.kind != "link" or pristine.entries.get(path) == entry:
            continue
        leads = _resolve(path, work, workdir)
        if leads is not None:
            reasons.append(
                f"{posixpath.join(workdir, path)}: a link that leads out of the work folder "
                f"({entry.digest!r} reaches {leads})"
            )
    return reasons


def _open_member(source: tarfile.TarFile, member: tarfile.TarInfo) -> tuple[IO[bytes], int]:
    """A regular member's data and size (a hard link's are those of the file it links to)."""
    try:
        handle = source.extractfile(member)
    except KeyError:  # a hard link to a member that is not in the archive
        handle = None
    if handle is None:
        return io.BytesIO(b""), 0
    linked = member
    for _ in range(MAX_LINK_FOLLOWS):  # tar gives the data's size at the file a link names
        if not linked.islnk():
            return handle, linked.size
        try:
            linked = source.getmember(linked.linkname)
        except KeyError:  # named otherwise than as archived
            break
    data = handle.read()  # read it to know its size
    return io.BytesIO(data), len(data)


class _Hashing:
    """A member's data read through sha256, so that no file is held whole in memory."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle, self.digest = handle, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.digest.update(data)
        return data
