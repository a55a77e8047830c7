"""Offline instances: a plain-folder snapshot becomes a git repo at a reproducible base commit.

A plain snapshot is a folder of files without ``.git`` (the project cannot commit nested
repositories; snapshots that are git repositories or bundles: ``repository.py``).
``commit_script`` turns it into a one-commit git repository whose commit hash depends only on
the files: author, committer, dates and message are fixed, and file modes are not tracked.
The instance's ``base_commit`` is that hash, so an offline instance's eval script can name its
base commit exactly as the official ones do (``git checkout <base> tests/...``), and a
snapshot edited without regenerating its instance is caught.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

START_MARKER = ">>>>> Start Test Output"
END_MARKER = ">>>>> End Test Output"
SNAPSHOT_GIT_ENV = {
    "GIT_AUTHOR_NAME": "ThunderSync",
    "GIT_AUTHOR_EMAIL": "fixtures@thundersync.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "ThunderSync",
    "GIT_COMMITTER_EMAIL": "fixtures@thundersync.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}
HEREDOC_DELIMITER = "EOF_114329324912"
"""The delimiter the official eval scripts use around the test patch."""


def commit_script() -> str:
    """Shell commands, run inside the snapshot's folder, that commit it and print the hash."""
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in SNAPSHOT_GIT_ENV.items())
    git = "git -c core.fileMode=false -c core.autocrlf=false -c commit.gpgsign=false"
    return (
        f"export {env} && rm -rf .git && git -c init.defaultBranch=main init -q && "
        f"{git} add -A && {git} commit -q --no-verify -m 'base commit' && git rev-parse HEAD"
    )


def snapshot_commit(snapshot: Path) -> str:
    """The base commit hash that ``commit_script`` gives for ``snapshot`` (run on a copy)."""
    with tempfile.TemporaryDirectory(prefix="swebench-snapshot-") as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(snapshot, repo, ignore=shutil.ignore_patterns("__pycache__"))
        done = subprocess.run(
            ["bash", "-c", commit_script()], cwd=repo, capture_output=True, text=True, timeout=60
        )
    if done.returncode != 0:
        raise RuntimeError(f"{snapshot}: git commit failed: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


def make_eval_script(
    *, base_commit: str, test_patch: str, test_files: Sequence[str], test_command: str
) -> str:
    """An eval script in the official SWE-bench shape: reset the test files to the base
    commit, apply the test patch, run the tests between the start and end markers (which
    ``set -x`` prints, as the official scripts rely on), then reset the test files again."""
    if HEREDOC_DELIMITER in test_patch:
        raise ValueError(f"test_patch contains the heredoc delimiter {HEREDOC_DELIMITER}")
    files = " ".join(shlex.quote(f) for f in test_files)
    patch = test_patch if test_patch.endswith("\n") else test_patch + "\n"
    return (
        "#!/bin/bash\n"
        "set -uxo pipefail\n"
        "cd /testbed\n"
        "export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'\n"
        "export PYTHONDONTWRITEBYTECODE=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1\n"
        "git status\n"
        f"git -c core.fileMode=false diff {base_commit}\n"
        f"git checkout {base_commit} {files}\n"
        f"git apply -v - <<'{HEREDOC_DELIMITER}'\n{patch}{HEREDOC_DELIMITER}\n"
        f": '{START_MARKER}'\n"
        f"{test_command}\n"
        f": '{END_MARKER}'\n"
        f"git checkout {base_commit} {files}\n"
    )
