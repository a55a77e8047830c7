"""The agent's work folder as an archive: taken out of one sandbox, compared, put into another.

Strict grading (docs/design.md §6) grades in a fresh sandbox that receives only the agent's
work folder (the task's WORKDIR). ``export_work`` archives that folder inside a sandbox with
``tar`` and downloads the archive; on the host it is read member by member into a clean
archive that holds only folders, regular files (hard links become copies) and symbolic links,
with set-id bits dropped and no absolute or ``..`` names, so a steered ``tar`` in the episode's
sandbox cannot smuggle anything else in. ``import_work`` empties the fresh sandbox's work
folder and unpacks the clean archive there with the fresh sandbox's own ``tar``.

``WorkTree.changed_since`` lists what the agent added, changed or deleted relative to the work
folder of a fresh sandbox (the task's pristine state), which is what tamper detection judges.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path

from environments.sandboxes.protocol import Sandbox, SandboxError

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
        if self.entries.get(path, Entry("", "")).kind != "file":
            return ""
        with tarfile.open(self.archive) as archive:
            handle = archive.extractfile(path)
            data = handle.read(limit) if handle is not None else b""
        return data.decode("utf-8", errors="replace")

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


def _scratch_command(workdir: str, scratch: str) -> str:
    s, w = shlex.quote(scratch), shlex.quote(workdir)
    archive = shlex.quote(f"{scratch}/{ARCHIVE_NAME}")
    # GNU tar exits 1 when a file changed while it was read: the archive is still complete.
    return (
        f"rm -rf {s} && mkdir -p {s} && test -d {w} && "
        f"{{ tar -C {w} -cf {archive} . ; rc=$?; test $rc -le 1; }}"
    )


def export_work(sandbox: Sandbox, workdir: str, host_dir: Path, name: str) -> WorkTree:
    """Archive ``workdir`` in ``sandbox`` and read it into a clean archive ``host_dir/name``.
    WorkExportError when the folder cannot be archived; SandboxError when the sandbox fails."""
    failures = []
    for scratch in scratch_folders(workdir):
        made = sandbox.execute(_scratch_command(workdir, scratch), timeout=TIMEOUT_S)
        if made.exit_code == 0:
            raw = host_dir / f"{name}.raw"
            try:
                sandbox.download(f"{scratch}/{ARCHIVE_NAME}", raw)
            except (OSError, ValueError) as err:
                raise SandboxError(f"cannot download the archive of {workdir}: {err}") from err
            finally:
                sandbox.execute(f"rm -rf {shlex.quote(scratch)}", timeout=TIMEOUT_S)
            try:
                return _clean(raw, host_dir / name)
            finally:
                raw.unlink(missing_ok=True)
        status = "timed out" if made.timed_out else f"exit {made.exit_code}"
        failures.append(f"{scratch} ({status}): {made.output.strip()[-300:]}")
    raise WorkExportError(f"cannot archive the work folder {workdir}: {'; '.join(failures)}")


def import_work(sandbox: Sandbox, workdir: str, work: WorkTree) -> None:
    """Replace ``workdir`` in ``sandbox`` (a fresh one) by the clean archive's contents."""
    w = shlex.quote(workdir)
    for scratch in scratch_folders(workdir):
        s = shlex.quote(scratch)
        made = f"mkdir -p {w} && rm -rf {s} && mkdir -p {s}"
        if sandbox.execute(made, timeout=TIMEOUT_S).exit_code != 0:
            continue
        sandbox.upload(work.archive, f"{scratch}/{ARCHIVE_NAME}")
        archive = shlex.quote(f"{scratch}/{ARCHIVE_NAME}")
        done = sandbox.execute(
            f"find {w} -mindepth 1 -maxdepth 1 ! -name '{OWN_PREFIX}*' -exec rm -rf {{}} + && "
            f"tar --no-same-owner -C {w} -xf {archive}; rc=$?; rm -rf {s}; exit $rc",
            timeout=TIMEOUT_S,
        )
        if done.exit_code != 0:
            raise SandboxError(f"unpacking the agent's work into {workdir} failed: {done.output}")
        return
    raise SandboxError(f"no scratch folder ({', '.join(scratch_folders(workdir))}) in the sandbox")


def _member_name(raw: str) -> str | None:
    """The member's path relative to the work folder; None for the folder itself, a name
    that leaves it, or one of the project's own markers."""
    name = posixpath.normpath(raw.lstrip("/")) if raw not in ("", ".", "./") else "."
    if name == "." or name == ".." or name.startswith("../") or raw.startswith("/"):
        return None
    if name.split("/", 1)[0].startswith(OWN_PREFIX):
        return None
    return name


def _clean(raw: Path, clean: Path) -> WorkTree:
    """Copy ``raw``'s folders, files and links into ``clean``; index them."""
    entries: dict[str, Entry] = {}
    try:
        with tarfile.open(raw) as source, tarfile.open(clean, "w") as target:
            for member in source:
                name = _member_name(member.name)
                kept = member.isdir() or member.isfile() or member.issym() or member.islnk()
                if name is None or not kept:
                    continue
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
                    data = _read_member(source, member)
                    copy.size = len(data)
                    target.addfile(copy, io.BytesIO(data))
                    entries[name] = Entry("file", hashlib.sha256(data).hexdigest())
    except (tarfile.TarError, OSError, EOFError) as err:
        raise WorkExportError(f"the archive of the work folder is unreadable: {err}") from err
    return WorkTree(clean, entries)


def _read_member(source: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    try:
        handle = source.extractfile(member)
    except KeyError:  # a hard link to a member that is not in the archive
        return b""
    return handle.read() if handle is not None else b""
