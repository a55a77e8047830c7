"""Where an instance's repository comes from, and how it reaches /testbed at its base commit.

Four sources, one strategy object each, picked once per task (``repo_source``):

- ``OfficialImage``: the row's Docker image already holds /testbed at ``base_commit``.
- ``PlainFolder``: a ``repo_snapshot`` folder of plain files (no ``.git``), copied in and
  committed with a fixed identity (``snapshot.commit_script``): ``base_commit`` is that hash.
- ``GitRepository``: a ``repo_snapshot`` folder that is a git repository (``.git`` inside),
  used at its real ``base_commit``.
- ``GitBundle``: a ``repo_snapshot`` file made by ``git bundle create``, likewise.

A repository or bundle is never copied as it is: its history up to ``base_commit`` is fetched
into a fresh repository (cached per process, removed at exit), and only that repository's
``.git`` goes into the sandbox, where ``setup`` checks it out. Like the official images
(swebench's ``git_clone_timesafe``), the agent then finds no later commits, tags, remotes,
hooks or config of the source, and no untracked or uncommitted files.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from environments.sandboxes.protocol import SandboxError
from environments.swebench.snapshot import commit_script

BRANCH = "main"
_GIT = "git -c safe.directory='*'"
_HOST_GIT_ENV = {
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}
_BUNDLE_SIGNATURES = (b"# v2 git bundle\n", b"# v3 git bundle\n")
_MAX_BUNDLE_HEADER = 1 << 20


class RepoSource(Protocol):
    """How a task's sandbox gets its repository at the base commit."""

    def files(self) -> Path | None:
        """The host folder copied to /testbed (None: the image has it); raises SandboxError
        when it cannot be prepared."""
        ...

    def setup_script(self) -> str:
        """Shell commands run in /testbed after the copy; the last line they print is HEAD."""
        ...

    def mismatch_hint(self) -> str:
        """What to do when HEAD is not the base commit."""
        ...


@dataclass(frozen=True, slots=True)
class OfficialImage:
    image: str

    def files(self) -> Path | None:
        return None

    def setup_script(self) -> str:
        return f"{_GIT} rev-parse HEAD"

    def mismatch_hint(self) -> str:
        return f"run it in Docker with the image {self.image}"


@dataclass(frozen=True, slots=True)
class PlainFolder:
    path: Path

    def files(self) -> Path | None:
        return self.path

    def setup_script(self) -> str:
        return commit_script()

    def mismatch_hint(self) -> str:
        return f"the snapshot {self.path} changed since the row was made: regenerate the row"


@dataclass(frozen=True, slots=True)
class GitRepository:
    path: Path
    base_commit: str
    where: str
    """``<file>: instance <id>``, for error messages."""

    def files(self) -> Path | None:
        return _staged(self.path, self.base_commit, self.where, is_bundle=False)

    def setup_script(self) -> str:
        return _checkout_script()

    def mismatch_hint(self) -> str:
        return f"check that {self.path} holds commit {self.base_commit}"


@dataclass(frozen=True, slots=True)
class GitBundle:
    path: Path
    base_commit: str
    where: str

    def files(self) -> Path | None:
        return _staged(self.path, self.base_commit, self.where, is_bundle=True)

    def setup_script(self) -> str:
        return _checkout_script()

    def mismatch_hint(self) -> str:
        return f"check that the bundle {self.path} holds commit {self.base_commit}"


def _checkout_script() -> str:
    return f"{_GIT} checkout -q -f {BRANCH} && {_GIT} rev-parse HEAD"


def repo_source(snapshot: Path | None, *, image: str, base_commit: str, where: str) -> RepoSource:
    """The strategy for a row: its image when it has no snapshot, else by the snapshot's kind."""
    if snapshot is None:
        return OfficialImage(image)
    if snapshot.is_file():
        return GitBundle(snapshot, base_commit, where)
    if (snapshot / ".git").exists():
        return GitRepository(snapshot, base_commit, where)
    return PlainFolder(snapshot)


def check_snapshot(path: Path, base_commit: str, roots: tuple[Path, ...]) -> None:
    """Raise ValueError saying what is wrong with a resolved ``repo_snapshot``: not a folder
    or bundle; a repository whose git folder lies outside ``roots``, or that lacks
    ``base_commit``; a bundle that needs other commits (prerequisites)."""
    if path.is_file():
        _check_bundle(path)
    elif not path.is_dir():
        raise ValueError(f"{path} is neither a folder nor a git bundle file")
    elif (path / ".git").exists():
        _check_repository(path, base_commit, roots)


def _check_repository(path: Path, base_commit: str, roots: tuple[Path, ...]) -> None:
    dirs = _host_git(["rev-parse", "--absolute-git-dir", "--git-common-dir"], cwd=path)
    for line in dirs.splitlines():
        real = (path / line).resolve()
        if not any(real == root or root in real.parents for root in roots):
            raise ValueError(f"its git folder {real} lies outside {_names(roots)}")
    try:
        _host_git(["cat-file", "-e", f"{base_commit}^{{commit}}"], cwd=path)
    except ValueError as exc:
        raise ValueError(f"the repository {path} has no commit {base_commit}") from exc


def _check_bundle(path: Path) -> None:
    with path.open("rb") as f:
        header = f.read(_MAX_BUNDLE_HEADER)
    if not header.startswith(_BUNDLE_SIGNATURES):
        raise ValueError(f"{path} is a file but not a git bundle (made by `git bundle create`)")
    for line in header.split(b"\n\n", 1)[0].splitlines()[1:]:
        if line.startswith(b"-"):
            raise ValueError(
                f"the bundle {path} needs commits it does not hold ({line.decode()[:60]}): "
                "make it with the whole history (`git bundle create FILE --all`)"
            )


def _names(roots: tuple[Path, ...]) -> str:
    return " or ".join(str(root) for root in roots)


# --- staging: the history up to base_commit in a fresh repository ----------------------------

_STAGED: dict[tuple[str, str], Path] = {}
_LOCK = threading.Lock()
_STAGING_ROOT: list[Path] = []


def _staged(source: Path, base_commit: str, where: str, *, is_bundle: bool) -> Path:
    """A folder holding only ``.git``: ``source``'s history up to ``base_commit`` on branch
    ``main`` (not checked out); made once per process and source."""
    key = (str(source), base_commit)
    with _LOCK:
        folder = _STAGED.get(key)
        if folder is not None and (folder / ".git").is_dir():
            return folder
        folder = Path(tempfile.mkdtemp(prefix="repo-", dir=_staging_root()))
        try:
            _fetch(source, base_commit, folder, is_bundle=is_bundle)
        except ValueError as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise SandboxError(
                f"{where}: field 'repo_snapshot': cannot take commit {base_commit} "
                f"from {source}: {exc}"
            ) from exc
        _STAGED[key] = folder
        return folder


def _fetch(source: Path, base_commit: str, folder: Path, *, is_bundle: bool) -> None:
    origin = source
    if is_bundle:
        # A bundle's pack holds every commit it carries, later ones included: unpack it into
        # a scratch repository, then fetch from there only what base_commit reaches.
        origin = folder.with_name(folder.name + "-bundle.git")
        _host_git(["init", "-q", "--bare", str(origin)], cwd=folder)
        _host_git(["fetch", "-q", "--no-tags", str(source), base_commit], cwd=origin)
        _host_git(["update-ref", "refs/thundersync/base", base_commit], cwd=origin)
    try:
        _host_git(["-c", f"init.defaultBranch={BRANCH}", "init", "-q"], cwd=folder)
        _host_git(["fetch", "-q", "--no-tags", str(origin), base_commit], cwd=folder)
        _host_git(["update-ref", f"refs/heads/{BRANCH}", base_commit], cwd=folder)
        _host_git(["config", "gc.auto", "0"], cwd=folder)
        (folder / ".git" / "FETCH_HEAD").unlink(missing_ok=True)
    finally:
        if is_bundle:
            shutil.rmtree(origin, ignore_errors=True)


def _host_git(args: list[str], *, cwd: Path) -> str:
    """Run git on the host with no user or system config; ValueError with its message."""
    command = ["git", "-c", "safe.directory=*", "-c", "protocol.file.allow=always", *args]
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=_host_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"git {args[0]} failed: {exc}") from exc
    if done.returncode != 0:
        raise ValueError(f"git {' '.join(args[:2])} failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def _host_env() -> dict[str, str]:
    # GIT_DIR, GIT_INDEX_FILE and the like from the caller's environment would redirect git
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    return {**env, **_HOST_GIT_ENV}


def _staging_root() -> Path:
    if not _STAGING_ROOT:
        root = Path(tempfile.mkdtemp(prefix="thundersync-swebench-repos-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _STAGING_ROOT.append(root)
    return _STAGING_ROOT[0]
