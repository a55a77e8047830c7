"""The agent's patch, made without a program of the agent's sandbox: its repository taken out by
the sandbox engine, diffed against the base commit by a fresh sandbox's own git.

The official flow runs ``git add -A && git diff --cached <base>`` in the agent's sandbox, where
the agent may have replaced ``git`` (to emit a patch its tree does not hold), ``stat``,
``base64`` or ``tail`` (which read the patch out), or broken the shell. Here:

- ``export_repo`` has the engine archive (``Sandbox.export_folder``) the agent's ``/testbed``
  without ``.git`` (cleaned as ``environments.work`` cleans a work folder: only folders,
  regular files and links), and ``.git`` without its object store, which gives the agent's
  ``info/exclude`` (which hides new files, as in the official flow) and its hooks and config
  (``git_state``, read on the host: reported by the audit, they never run);
- ``diff_in`` unpacks that tree in the fresh sandbox, next to its clean checkout of the base
  commit, and runs the fresh sandbox's git there: a throwaway index read from the base commit,
  ``add -A`` over the agent's tree (so the agent's index and skip-worktree bits hide nothing;
  ``.gitignore`` files and the agent's ``info/exclude`` hide new files), ``diff --cached
  --binary`` against the base commit, hooks and fsmonitor off.

What the agent can cause (no ``.git``, an unreadable tree, a tree git cannot add, a patch over
the limit) raises ``AgentFailure``: its 0, never an infrastructure failure. Both exports, the
tree and ``.git``, go through one error map (``work.export_agent_folder``): sparse files past
the export limit or folder names past the host's path limit are the agent's doing in either.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from environments.sandboxes.protocol import Sandbox, SandboxError, parse_size
from environments.swebench.transfer import read_bytes, write_bytes
from environments.work import WorkExportError, WorkTree, export_agent_folder, export_work

GIT_LEFT_OUT = ("objects", "modules", "lfs")
"""Children of ``.git`` never exported: the object stores, by far the largest part."""
MAX_GIT_FILE_BYTES = 1024 * 1024
MAX_HOOKS = 50
MAX_CONFIG_LINES = 500
DIFF_TIMEOUT_S = 600.0
_GIT = (
    "git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor= "
    "-c core.quotePath=false"
)


class AgentFailure(Exception):  # noqa: N818 (the agent's failure, not the harness's error)
    """What the agent left gives no patch (no ``.git``, an unreadable tree, a patch over the
    limit): it scores 0 with ``details["agent_failure"]``."""


@dataclass(frozen=True, slots=True)
class AgentRepo:
    """The agent's repository on the host: its work tree (no ``.git``), the ``.git/info/
    exclude`` it had, and its hooks and config as ``git_state`` lists them."""

    tree: WorkTree
    exclude: bytes
    git_state: frozenset[str]


def export_repo(sandbox: Sandbox, testbed: str, host_dir: Path) -> AgentRepo:
    """Take the repository at ``testbed`` out of ``sandbox`` through the engine."""
    exclude, state = _git_metadata(sandbox, testbed, host_dir)
    try:
        tree = export_work(sandbox, testbed, host_dir, "tree.tar", exclude=(".git",))
    except WorkExportError as err:
        raise AgentFailure(f"the repository's files: {err}") from err
    return AgentRepo(tree, exclude, state)


def git_state(sandbox: Sandbox, testbed: str, host_dir: Path) -> frozenset[str]:
    """Hooks (``hook NAME``, git's ``*.sample`` aside) and config entries (``config local\\t
    key=value``, as ``git config --list --show-scope`` writes them) of the repository at
    ``testbed``, read on the host from the engine's archive of its ``.git``; bounded."""
    return _git_metadata(sandbox, testbed, host_dir)[1]


def _git_metadata(sandbox: Sandbox, testbed: str, host_dir: Path) -> tuple[bytes, frozenset[str]]:
    git_dir = posixpath.join(testbed, ".git")
    with tempfile.TemporaryDirectory(prefix="git-", dir=host_dir) as tmp:
        raw = Path(tmp) / "git.tar"
        try:
            export_agent_folder(sandbox, git_dir, raw, exclude=GIT_LEFT_OUT, what="the folder")
        except WorkExportError as err:  # the same map as the work tree's: one label per cause
            raise AgentFailure(
                f"{git_dir} is missing, not a folder, unreadable, too large or too deep to "
                "archive after the episode: the agent broke the repository, which scores 0 as "
                f"a failed git diff does: {err}"
            ) from err
        hooks: list[str] = []
        files: dict[str, bytes] = {}
        try:
            with tarfile.open(raw) as archive:
                for member in archive:
                    parts = member.name.split("/")
                    if parts[1:2] == ["hooks"] and len(parts) == 3:
                        if not parts[2].endswith(".sample"):
                            hooks.append(parts[2])
                    elif "/".join(parts[1:]) in ("config", "info/exclude") and member.isfile():
                        handle = archive.extractfile(member)
                        data = handle.read(MAX_GIT_FILE_BYTES + 1) if handle else b""
                        files["/".join(parts[1:])] = data
        except (tarfile.TarError, OSError, EOFError) as err:  # as work.py's _clean: the agent's
            raise AgentFailure(f"the archive of {git_dir} is unreadable: {err}") from err
        config = _config_entries(files.get("config", b""), Path(tmp) / "config")
    state = {f"hook {name}" for name in sorted(hooks)[:MAX_HOOKS]} | config
    exclude = files.get("info/exclude", b"")
    if len(exclude) > MAX_GIT_FILE_BYTES:
        raise AgentFailure(f"{git_dir}/info/exclude is over {MAX_GIT_FILE_BYTES} bytes")
    return exclude, frozenset(state)


def _config_entries(data: bytes, path: Path) -> set[str]:
    """``config local\\tkey=value`` per entry of a repository's config file, parsed by the
    host's git (no user or system config, includes not followed)."""
    if len(data) > MAX_GIT_FILE_BYTES:
        return {f"unreadable config: over {MAX_GIT_FILE_BYTES} bytes"}
    path.write_bytes(data)
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env |= {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
    command = ["git", "config", "--file", str(path), "--list", "--no-includes"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SandboxError(f"the host's git cannot read a config file: {err}") from err
    if done.returncode != 0:
        return {"unreadable config: " + done.stderr.decode(errors="replace").strip()[:200]}
    lines = done.stdout.decode(errors="replace").splitlines()[:MAX_CONFIG_LINES]
    return {f"config local\t{line}" for line in lines if line.strip()}


def diff_in(
    sandbox: Sandbox,
    repo: AgentRepo,
    *,
    testbed: str,
    base_commit: str,
    scratch: str,
    out: str,
    max_bytes: int,
    chunk_bytes: int,
) -> bytes:
    """The agent's patch, made by the git of ``sandbox`` (a fresh one, set up at
    ``base_commit``) over the agent's tree unpacked in ``scratch``; left at ``out`` there and
    returned. The unpacked tree is removed again (its ignored files never reach the tests)."""
    tree, archive = f"{scratch}/agent-tree", f"{scratch}/agent-tree.tar"
    exclude, index = f"{scratch}/agent-exclude", f"{scratch}/agent-index"
    sandbox.upload(repo.tree.archive, archive)
    write_bytes(sandbox, exclude, repo.exclude)
    t, q = shlex.quote(tree), shlex.quote
    git = (
        f"GIT_DIR={q(testbed + '/.git')} GIT_WORK_TREE={t} GIT_INDEX_FILE={q(index)} "
        f"GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 "
        f"{_GIT} -c core.excludesFile={q(exclude)}"
    )
    diff = (
        "diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames "
        f"--src-prefix=a/ --dst-prefix=b/ {base_commit}"
    )
    result = sandbox.execute(
        f"rm -rf {t} && mkdir -p {t} && tar --no-same-owner -C {t} -xf {q(archive)} && "
        f"rm -f {q(archive)} && cd {t} && {git} read-tree {base_commit} && {git} add -A && "
        f"{git} {diff} > {q(out)}; rc=$?; cd / && rm -rf {t} {q(index)} {q(archive)}; exit $rc",
        timeout=DIFF_TIMEOUT_S,
    )
    if result.timed_out or result.exit_code != 0:
        status = "timed out" if result.timed_out else f"exit {result.exit_code}"
        raise AgentFailure(
            f"git could not diff the agent's tree against the base commit ({status}): "
            f"{result.output[-500:]}"
        )
    stat = sandbox.execute(f"stat -c %s {q(out)}", timeout=60)
    size = parse_size(stat.output) if stat.exit_code == 0 else None
    if size is None:
        raise SandboxError(f"cannot stat the patch in the fresh sandbox: {stat.output[-200:]}")
    if size > max_bytes:
        raise AgentFailure(f"the agent's patch is {size} bytes, over {max_bytes}")
    return read_bytes(sandbox, out, chunk_bytes=chunk_bytes)
