"""Harbor's ``artifacts`` and ``[[verifier.collect]]`` hooks (task.toml schema 1.4): files a task
keeps of an episode's sandbox, gathered after the agent's turn and before grading.

Harbor's order (trial.py ``_collect_artifacts_phased``): the task's collect hooks, then the
step's, run in the agent's sandbox (``bash -c``, each with its own timeout; a failure is a
warning, never the episode's); then each artifact is copied out, with the convention folder
``/logs/artifacts`` first. On the host an artifact lands at its ``destination`` or at its
source path without the leading ``/`` (``/app/out`` -> ``app/out``), and ``manifest.json``
lists every entry with its ``type`` and ``status`` (``ok``, ``empty``, ``failed``,
``skipped``). Folders leave through the sandbox engine (``work.export_work``: a clean archive,
no program of the sandbox takes part) and are unpacked with tarfile's ``data`` filter; a file
is copied by the engine (links stay links) if it is at most ``MAX_FILE_BYTES``. The agent's
sandbox and, in Docker, a compose task's services beside it are reached (a hook or entry of
another ``service`` runs or is copied there: ``_service``); where there is no such service it
is ``skipped`` with its reason. Hooks run in the order given, whatever their service (Harbor
runs ``main``'s, copies ``main``'s artifacts, then runs the sidecars': no container's hook can
change another's files, so the order shows nowhere).
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import shlex
import tarfile
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments import work
from environments.sandboxes.protocol import HasServices, Sandbox, SandboxError, own, parse_size
from environments.tasks import TaskFormatError
from environments.terminal_bench import schema, users
from thundersync.protocol.documents import excerpt

CONVENTION_DIR = "/logs/artifacts"
"""Collected from every episode (Harbor's implicit first entry): where an agent publishes."""
MANIFEST = "manifest.json"
MISSING = "no such file or folder"
MAIN = "main"
MAX_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_HOOK_TIMEOUT_S = 60.0
ARTIFACT_KEYS = frozenset({"source", "destination", "exclude", "service"})
HOOK_KEYS = frozenset({"command", "service", "timeout_sec", "user"})


@dataclass(frozen=True, slots=True)
class Artifact:
    """One ``artifacts`` entry (Harbor's ``ArtifactConfig``; a string is its ``source``)."""

    source: str
    destination: str | None = None
    exclude: tuple[str, ...] = ()
    service: str = MAIN


@dataclass(frozen=True, slots=True)
class CollectHook:
    """One ``[[verifier.collect]]`` entry (Harbor's ``VerifierCollectConfig``)."""

    command: str
    service: str = MAIN
    timeout_s: float = DEFAULT_HOOK_TIMEOUT_S
    user: str | None = None
    """Who it runs as (``users``); None: the container's user."""


def _parts(path: Path, field: str, value: str) -> tuple[str, ...]:
    parts = tuple(p for p in value.split("/") if p not in ("", "."))
    if ".." in parts or "\\" in value:
        raise TaskFormatError(path, field, f"expected a path without '..' or '\\', got {value!r}")
    return parts


def _artifact(path: Path, field: str, entry: object) -> Artifact:
    table = (
        {"source": entry} if isinstance(entry, str) else schema.check_mapping(path, field, entry)
    )
    schema.check_keys(path, table, ARTIFACT_KEYS, prefix=f"{field}.", strict=False)
    source = schema.read_text(path, f"{field}.source", table.get("source"))
    _parts(path, f"{field}.source", source)
    destination = schema.read_optional_str(
        path, f"{field}.destination", table.get("destination"), ""
    )
    if destination and (
        destination.startswith("/")
        or not _parts(path, f"{field}.destination", destination)
        or destination.rstrip("/") == MANIFEST
    ):
        raise TaskFormatError(
            path,
            f"{field}.destination",
            f"expected a relative path other than {MANIFEST}, got {destination!r}",
        )
    exclude: object = table.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
        raise TaskFormatError(
            path, f"{field}.exclude", f"expected a list of patterns, got {excerpt(exclude)}"
        )
    service = schema.read_optional_str(path, f"{field}.service", table.get("service"), MAIN)
    if service != MAIN and not source.startswith("/"):
        raise TaskFormatError(
            path, f"{field}.source", f"expected an absolute path for service {service!r}"
        )
    return Artifact(source, destination or None, tuple(exclude), service)


def read_artifacts(path: Path, field: str, value: object) -> tuple[Artifact, ...]:
    """A task's or step's ``artifacts`` list; a malformed entry raises TaskFormatError."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TaskFormatError(path, field, f"expected a list of paths, got {excerpt(value)}")
    return tuple(_artifact(path, f"{field}[{i}]", entry) for i, entry in enumerate(value))


def read_hooks(path: Path, field: str, value: object) -> tuple[CollectHook, ...]:
    """A ``[[verifier.collect]]`` list; a malformed entry raises TaskFormatError."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TaskFormatError(path, field, f"expected [[{field}]] tables, got {excerpt(value)}")
    hooks = []
    for i, entry in enumerate(value):
        name = f"{field}[{i}]"
        table = schema.check_mapping(path, name, entry)
        schema.check_keys(path, table, HOOK_KEYS, prefix=f"{name}.", strict=False)
        hooks.append(
            CollectHook(
                command=schema.read_text(path, f"{name}.command", table.get("command")),
                service=schema.read_optional_str(
                    path, f"{name}.service", table.get("service"), MAIN
                ),
                timeout_s=schema.read_timeout(
                    path, f"{name}.timeout_sec", table.get("timeout_sec"), DEFAULT_HOOK_TIMEOUT_S
                ),
                user=users.read_user(path, f"{name}.user", table.get("user")),
            )
        )
    return tuple(hooks)


def _service(sandbox: Sandbox, name: str) -> Sandbox | None:
    """The sandbox a hook or artifact of service ``name`` is reached in: ``main``, the agent's;
    another, the compose service of that name beside it (a Docker sandbox's ``service``);
    None where there is none (bubblewrap refuses compose tasks before the episode)."""
    if name == MAIN:
        return sandbox
    return sandbox.service(name) if isinstance(sandbox, HasServices) else None


def run_hooks(sandbox: Sandbox, hooks: Sequence[CollectHook], task_id: str) -> list[str]:
    """Run ``hooks`` in order, each in the sandbox of its ``service`` (``_service``; a
    sidecar's with ``sh -c``, as Harbor runs it); what failed (each also a warning)."""
    failures = []
    for hook in hooks:
        target = _service(sandbox, hook.service)
        if target is None:
            failures.append(f"{hook.command[:80]!r}: no service {hook.service!r} in this sandbox")
            continue
        with users.running_as(target, hook.user):
            result = target.execute(hook.command, timeout=hook.timeout_s)
        if result.exit_code != 0 or result.timed_out:
            status = "timed out" if result.timed_out else f"exited {result.exit_code}"
            failures.append(f"{hook.command[:80]!r} {status}: {result.output.strip()[-200:]}")
    for failure in failures:
        warnings.warn(f"task {task_id}: collect hook {failure}", UserWarning, stacklevel=2)
    return failures


def _host_target(root: Path, artifact: Artifact) -> Path:
    rel = artifact.destination or artifact.source
    return root.joinpath(*[p for p in rel.split("/") if p not in ("", ".", "..")])


def _copy_folder(sandbox: Sandbox, source: str, target: Path, exclude: Sequence[str]) -> bool:
    """Whether the folder held anything; raises work.WorkExportError or SandboxError."""
    with tempfile.TemporaryDirectory(prefix="thundersync-artifact-") as tmp:
        tree = work.export_work(
            sandbox, source, Path(tmp), "artifact.tar", max_entries=MAX_ARTIFACT_ENTRIES
        )
        kept = {
            name
            for name in tree.entries
            if not any(
                fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(part, pattern)
                for pattern in exclude
                for part in name.split("/")
            )
        }
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tree.archive) as archive:
            members = [m for m in archive.getmembers() if m.name in kept]
            archive.extractall(target, members=members, filter="data")
        return bool(kept)


def _collect_one(sandbox: Sandbox, artifact: Artifact, root: Path, workdir: str) -> dict[str, Any]:
    target = _host_target(root, artifact)
    entry: dict[str, Any] = {
        "source": artifact.source,
        "destination": str(target.relative_to(root)),
        "service": artifact.service,
        "exclude": list(artifact.exclude),
    }
    if artifact.service != MAIN:
        found = _service(sandbox, artifact.service)
        if found is None:
            why = f"no service {artifact.service!r} in this sandbox"
            return {**entry, "type": "directory", "status": "skipped", "reason": why}
        sandbox, workdir = found, "/"
    source = posixpath.normpath(posixpath.join(workdir, artifact.source))
    quoted = shlex.quote(source)
    probe = sandbox.execute(
        own(
            f"if [ -L {quoted} ]; then echo link; elif [ -d {quoted} ]; then echo dir; "
            f"elif [ -f {quoted} ]; then stat -c %s {quoted}; else echo missing; fi"
        ),
        timeout=30,
    )
    answer = probe.output.strip()
    if answer == "link":  # Docker's archive holds the link, not what it names (red team)
        why = "a symbolic link: not copied"
        return {**entry, "type": "file", "status": "failed", "reason": why}
    if answer == "dir":
        try:
            has = _copy_folder(sandbox, source, target, artifact.exclude)
        except (work.WorkExportError, SandboxError, OSError, tarfile.TarError) as err:
            return {**entry, "type": "directory", "status": "failed", "reason": str(err)[:300]}
        return {**entry, "type": "directory", "status": "ok" if has else "empty"}
    size = parse_size(answer)  # a planted `stat` may answer anything (a root agent in Docker)
    if size is None or size > MAX_FILE_BYTES:
        why = MISSING if answer == "missing" else f"not copied: {answer[:100]}"
        return {**entry, "type": "file", "status": "failed", "reason": why}
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sandbox.download(source, target)
    except (SandboxError, OSError, tarfile.TarError) as err:
        return {**entry, "type": "file", "status": "failed", "reason": str(err)[:300]}
    return {**entry, "type": "file", "status": "ok"}


def collect(
    sandbox: Sandbox, artifacts: Sequence[Artifact], root: Path, *, workdir: str
) -> list[dict[str, Any]]:
    """Copy ``/logs/artifacts`` and ``artifacts`` out of ``sandbox`` into ``root`` and write
    ``root/manifest.json``; the manifest's entries."""
    entries = [Artifact(CONVENTION_DIR)]
    entries += [a for a in artifacts if (a.source.rstrip("/"), a.service) != (CONVENTION_DIR, MAIN)]
    root.mkdir(parents=True, exist_ok=True)
    manifest = [_collect_one(sandbox, artifact, root, workdir) for artifact in entries]
    if manifest[0].get("reason") == MISSING:  # the agent published nothing
        manifest[0] = {**manifest[0], "type": "directory", "status": "empty"}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


MAX_ARTIFACT_ENTRIES = 50_000
"""Files, links and folders a collected artifact folder may hold: each is re-created in a
grading sandbox, and 576,000 hard links to empty files took strict grading 20 minutes before
its disk ran out of inodes (red team, 2026-12-07); past it the folder is not copied."""
PROTECTED = ("/tests", "/logs/verifier")
"""Where no artifact is re-created: the grader's own folders (its tests, its reward files)."""
SYSTEM_DIRS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_DIRS += ("/etc", "/boot", "/proc", "/sys", "/dev", "/run", "/var/lib/dpkg")
"""Where strict grading re-creates no artifact: the grading sandbox's programs, libraries and
their configuration come from the task, never from files the agent chose (an artifact folder
declared there could hold a ``python3`` that a pinned PATH still finds)."""


@dataclass(frozen=True, slots=True)
class Restorable:
    """A collected artifact to re-create in a grading sandbox: its host copy and the path it
    gets there (Harbor's: its ``source``; the convention folder's, ``/logs/artifacts``)."""

    host: Path
    target: str


def _inside(path: str, folder: str) -> bool:
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder + "/") or folder == "/"


def restorable(
    manifest: Sequence[dict[str, Any]], root: Path, *, workdir: str, strict: bool = False
) -> tuple[list[Restorable], list[str]]:
    """The artifacts ``collect`` copied (status ``ok``) that a grading sandbox gets, and why
    the others it copied do not: one inside the work folder (the agent's work is copied in
    whole) is not needed, one under ``PROTECTED`` or at ``/`` is never placed, nor, when
    ``strict``, one under ``SYSTEM_DIRS``."""
    kept: list[Restorable] = []
    refused: list[str] = []
    for entry in manifest:
        if entry.get("status") != "ok":
            continue
        source = str(entry["source"])
        convention = source.rstrip("/") == CONVENTION_DIR and entry.get("service") == MAIN
        target = (
            CONVENTION_DIR if convention else posixpath.normpath(posixpath.join(workdir, source))
        )
        if _inside(target, workdir):
            continue
        if target == "/" or any(_inside(target, folder) for folder in PROTECTED):
            refused.append(f"{source}: the grader's own folder")
            continue
        if strict and any(_inside(target, folder) for folder in SYSTEM_DIRS):
            refused.append(f"{source}: a system folder (strict grading)")
            continue
        kept.append(Restorable(root / str(entry["destination"]), target))
    return kept, refused


def restored_paths(items: Sequence[Restorable]) -> list[str]:
    """Every file and link the artifacts place, by its path in the grading sandbox (what
    strict grading's path rules judge, as they judge the work folder's)."""
    paths = []
    for item in items:
        if item.host.is_dir():
            for host in sorted(item.host.rglob("*")):
                if not host.is_dir() or host.is_symlink():
                    rel = host.relative_to(item.host).as_posix()
                    paths.append(posixpath.join(item.target, rel))
        else:
            paths.append(item.target)
    return paths


def restore(sandbox: Sandbox, items: Sequence[Restorable]) -> None:
    """Re-create ``items`` in ``sandbox`` (a grading sandbox), as Harbor uploads the collected
    artifacts to a separate verifier: each replaces what is at its path (the agent may have
    made ``/logs/artifacts`` a file), with its parent folders made. What the agent left decides
    whether they fit: sparse files and hard links are restored at full size, so a grading
    sandbox too small for them, or a path the agent's own files block, is the agent's
    ``work.WorkExportError`` (its 0), as the work folder's is (``work.import_work``); a
    failing sandbox is SandboxError."""
    for item in items:
        quoted = shlex.quote(item.target)
        parent = shlex.quote(posixpath.dirname(item.target) or "/")
        made = sandbox.execute(own(f"rm -rf {quoted} && mkdir -p {parent}"), timeout=60)
        if made.exit_code != 0:
            raise work.WorkExportError(
                f"cannot place artifact {item.target} for grading: {made.output.strip()[-300:]}"
            )
        work.upload_agents(sandbox, item.host, item.target, what=f"artifact {item.target}")
