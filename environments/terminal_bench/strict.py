"""Strict grading's rules: which of the agent's files suspect tampering, and the grader's
pinned environment.

What strict grading does (``TerminalBenchTask.grade`` with ``GradingContext.strict``), after
Harbor's separate verifier environments, BenchFlow's lockdown and verifiers that restore test
files before grading:

- the tests run in a FRESH sandbox made from the task (its image, or the host's read-only
  files in bubblewrap), into which only the agent's work folder (the task's WORKDIR) is copied
  (``work.py``); interpreters, shells and tools therefore come from the task's image or the
  host, never from the agent's copies, and everything the agent did outside the work folder
  (installed packages, edited system files, a replaced ``python3``, a planted
  ``/logs/verifier/reward.txt``) is gone, except a Harbor task's collected artifacts, which are
  re-created at their source paths as Harbor's separate verifier gets them (never under /tests,
  /logs/verifier or a system folder; their files judged by the path rules below:
  ``collection.restore``);
- the test files are always the task's own, uploaded to /tests;
- the test script runs with a pinned environment (``pinned_environment``): ``PATH`` and
  ``LD_LIBRARY_PATH`` without relative entries or entries inside the work folder, no
  ``PYTHONPATH``, ``PYTHONSTARTUP``, ``PYTHONHOME``, ``LD_PRELOAD`` and similar hooks, pytest
  plugin autoloading off, no user site-packages, a fresh empty ``HOME``, git's fsmonitor
  off (hooks stay on: tests may run hooks of repositories they make). The task's
  ``[verifier] env`` is applied after pinning: a task that needs ``PYTHONPATH`` declares it there;
- the agent's added, changed or deleted files (relative to the task's pristine work folder)
  are judged by ``environments.tamper`` (``tamper_reasons``): any finding sets
  ``details["tamper_suspected"]`` with ``details["tamper_reasons"]`` and scores 0.

Deliberate limit: tasks whose tests check state outside the work folder (installed packages,
running services, files elsewhere) cannot pass strict grading, for any agent, the oracle
included, because that state is exactly what strict grading discards: telling a legitimately
installed package from a planted one would need the task to declare its artifacts. Such tasks
are graded non-strictly (the default of ``thundersync eval``); ``eval --agent oracle --strict``
shows which tasks of a suite qualify for strict grading. Every shipped task does.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import PurePosixPath

from environments import tamper
from environments.work import WorkTree

UNSET_VARIABLES = (
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONINSPECT",
    "PYTHONBREAKPOINT",
    "PYTHONWARNINGS",
    "LD_PRELOAD",
    "LD_AUDIT",
    "BASH_ENV",
    "ENV",
    "CDPATH",
    "GLOBIGNORE",
    "PYTEST_ADDOPTS",
    "PYTEST_PLUGINS",
    "PERL5OPT",
    "PERL5LIB",
    "NODE_OPTIONS",
    "RUBYOPT",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
)
"""Variables that load code or change how interpreters and test runners start."""


def pinned_environment(workdir: str) -> str:
    """Shell commands (ending in ``&&``-able form) that pin the environment for the test script."""
    inside = shlex.quote(workdir.rstrip("/"))
    keep = (
        f'case "$_e" in /*) case "$_e/" in {inside}/*) ;; *) _k="${{_k:+$_k:}}$_e" ;; esac ;; esac'
    )
    filters = " ; ".join(
        f'_k=; IFS=: read -r -a _d <<< "${{{name}:-}}"; for _e in "${{_d[@]}}"; do {keep}; done; '
        f'export {name}="$_k"'
        for name in ("PATH", "LD_LIBRARY_PATH")
    )
    return (
        f"unset {' '.join(UNSET_VARIABLES)} ; {filters} ; "
        '[ -n "$LD_LIBRARY_PATH" ] || unset LD_LIBRARY_PATH ; '
        "export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONNOUSERSITE=1 ; "
        "export GIT_CONFIG_PARAMETERS=\"'core.fsmonitor='\" ; "
        'export HOME="$(mktemp -d 2>/dev/null || echo /tmp)" ; unset _k _d _e'
    )


VENV_LAYOUT = ("bin/", "lib/", "lib64/", "include/", "share/")
"""The folders ``python3 -m venv`` (and pip installing into it) makes below a venv's root."""


def _venv_roots(pristine: WorkTree, work: WorkTree) -> list[str]:
    """Folders (below the work folder itself) that became virtual environments during the
    episode: a new ``pyvenv.cfg`` in a folder that is neither a package (``__init__.py``) nor
    one of the task's test folders."""
    roots = []
    for path in work.entries:
        parent = posixpath.dirname(path)
        if (
            PurePosixPath(path).name == "pyvenv.cfg"
            and parent
            and path not in pristine.entries
            and f"{parent}/__init__.py" not in work.entries
            and not tamper.is_test_file(path)
        ):
            roots.append(parent + "/")
    return roots


def _inside_venv(path: str, roots: list[str]) -> bool:
    """Whether ``path`` is what a venv made: its ``pyvenv.cfg`` or a file of its layout folders
    (``VENV_LAYOUT``), whose files only reach a run of the venv's own interpreter, which the
    agent built; a venv's site-packages holds ``pytest``, ``_pytest`` and ``.pth`` files that the
    path rules would otherwise flag. Anything else below a root, a ``conftest.py`` anywhere, is
    judged like every other file: a ``pyvenv.cfg`` does not hide a folder."""
    if PurePosixPath(path).name == "conftest.py":
        return False
    return any(
        path == f"{root}pyvenv.cfg" or path.startswith(tuple(root + d for d in VENV_LAYOUT))
        for root in roots
    )


def _judge(finding: tamper.TamperFinding, pristine: WorkTree, work: WorkTree) -> str | None:
    """The reason to report for a path rule's finding, or None when the content shows it
    harmless (package metadata whose entry points register no pytest plugin; a git config
    that gained no key that runs a program)."""
    parts = PurePosixPath(finding.path).parts
    if any(p.endswith((".dist-info", ".egg-info")) for p in parts[:-1]):
        if not tamper.registers_pytest_plugin(work.read(finding.path)):
            return None
        return "package metadata that registers a pytest plugin (entry point pytest11)"
    if ".git" in parts and parts[-1] in tamper.GIT_CONFIG_FILES:
        return _git_config_reason(finding.path, pristine, work)
    return finding.reason


GIT_CONFIG_LIMIT = 1024 * 1024
"""The largest git config judged by its keys; a larger one is flagged (a key past the part
read would go unseen)."""
GIT_LINK_LIMIT = 4096
"""The largest ``.git`` file (``gitdir: X``) or ``commondir`` judged by where it points."""


def _git_config_reason(path: str, pristine: WorkTree, work: WorkTree) -> str | None:
    """A git config file's finding when it gained a key that runs a program (or is too large
    to judge), else None."""
    text = work.read(path, limit=GIT_CONFIG_LIMIT + 1)
    if len(text.encode()) > GIT_CONFIG_LIMIT:
        return f"git configuration over {GIT_CONFIG_LIMIT} bytes (too large to judge)"
    added = tamper.git_config_command_keys(text)
    added -= tamper.git_config_command_keys(pristine.read(path, limit=GIT_CONFIG_LIMIT))
    if not added:
        return None
    return f"git configuration that runs programs ({', '.join(sorted(added))})"


def _git_folders(work: WorkTree) -> set[str]:
    """The folders of the work tree that git may take for a repository's git folder, whatever
    their name: every ``.git`` folder and every folder holding a ``HEAD`` (git's test of a git
    folder needs one, a linked one too). An agent that moves ``.git`` aside and leaves a
    ``.git`` file naming it moves the config and hooks the grader's git commands run."""
    folders = {
        path[: match.end()]
        for path in work.entries
        for match in re.finditer(r"(?:^|/)\.git(?=/)", path)
    }
    return folders | {
        posixpath.dirname(path)
        for path, entry in work.entries.items()
        if entry.kind != "dir" and PurePosixPath(path).name == "HEAD"
    }


def _git_link_reason(path: str, folders: set[str], work: WorkTree, text: str) -> str | None:
    """The finding for a changed ``.git`` file or ``commondir``, which make git take a
    repository's config (and a ``.git`` file its hooks) from another folder: allowed only as
    git itself writes them, a ``.git`` file naming a folder inside a ``.git`` folder
    (``git worktree add``, submodules) and a worktree's ``commondir`` of ``../..``; anything
    else (a link, another target, ``..`` after the last ``.git``) is flagged, as git resolves
    links and spaces where a reading of the text would not."""
    name = PurePosixPath(path).name
    if name != ".git" and not (name == "commondir" and posixpath.dirname(path) in folders):
        return None  # git reads a commondir only in a git folder (one with a HEAD)
    entry = work.entries[path]
    target = text.rstrip("\r\n")  # what git strips
    if name == ".git" and entry.kind == "file" and len(text) <= GIT_LINK_LIMIT:
        parts = target.removeprefix("gitdir: ").split("/") if target.startswith("gitdir: ") else []
        after = parts[len(parts) - parts[::-1].index("..") :] if ".." in parts else parts
        if ".git" in after:
            return None
    worktree = re.search(r"(?:^|/)\.git/worktrees/[^/]+/commondir$", path)
    if name == "commondir" and target == "../.." and entry.kind == "file" and worktree:
        return None
    return "a git folder link (.git file or commondir) naming a folder git's config comes from"


def _git_reason(
    path: str, folders: set[str], pristine: WorkTree, work: WorkTree, links: dict[str, str]
) -> str | None:
    """The finding for a changed file of git's (``_git_link_reason``; ``links``: the texts of
    the changed ``.git`` and ``commondir`` files, read at once) or of a git folder found by its
    contents (``_git_folders``), not by its name: a hook, a config file that gained a key that
    runs a program."""
    text = links.get(path, "")
    if (reason := _git_link_reason(path, folders, work, text)) is not None:
        return reason
    for folder in folders:
        inside = path[len(folder) + 1 :] if folder else path
        if folder and not path.startswith(folder + "/"):
            continue
        if inside in tamper.GIT_CONFIG_FILES:
            return _git_config_reason(path, pristine, work)
        if inside.startswith("hooks/") and tamper.is_git_hook(PurePosixPath(inside)):
            return "git hooks (run during grading's git commands)"
    return None


def tamper_reasons(
    workdir: str,
    pristine: WorkTree,
    work: WorkTree,
    modules: frozenset[str] = tamper.STDLIB_MODULES,
    test_files: frozenset[str] = frozenset(),
) -> list[str]:
    """``"<path>: <reason>"`` for each of the agent's files that touches test infrastructure:
    path rules (judged by content where that tells harmless from harmful), new modules that
    shadow one of ``modules`` (what the grading interpreter imports: ``tamper.importable_
    modules``), test sections of mixed config files, and the task's own test files changed or
    deleted: by their names, and ``test_files`` (the work folder's files the reference run's
    tests came from, ``witness.Reference.test_files``)."""
    all_changed, deleted = work.changed_since(pristine)
    venvs = _venv_roots(pristine, work)
    changed = [p for p in all_changed if not _inside_venv(p, venvs)]
    existed = set(pristine.entries)
    reasons: dict[str, str] = {}
    findings = tamper.path_findings(changed, existed=existed.__contains__)
    findings += tamper.shadowing_findings(
        changed,
        modules=modules,
        existed=existed.__contains__,
        is_package=lambda folder: f"{folder}/__init__.py" in work.entries,
    )
    for finding in findings:
        reason = _judge(finding, pristine, work)
        if reason is not None:
            reasons.setdefault(finding.path, reason)
    git_folders = _git_folders(work)
    named = [p for p in all_changed if PurePosixPath(p).name in (".git", "commondir")]
    links = work.read_many(named, GIT_LINK_LIMIT + 1)
    for path in all_changed:  # a venv's folders hide no git folder
        reason = _git_reason(path, git_folders, pristine, work, links)
        if reason is not None:
            reasons.setdefault(path, reason)
    for path in changed:
        if tamper.is_mixed_config(path) and tamper.pytest_config_sections_touched(
            pristine.read(path), work.read(path), PurePosixPath(path).name
        ):
            reasons.setdefault(path, "changes a test section of a configuration file")
    for path in [*all_changed, *deleted]:
        if path in pristine.entries and (tamper.is_test_file(path) or path in test_files):
            verb = "deletes" if path in deleted else "modifies"
            reasons.setdefault(path, f"{verb} one of the task's own test files")
    return [
        f"{posixpath.join(workdir, path)}: {reason}" for path, reason in sorted(reasons.items())
    ]
