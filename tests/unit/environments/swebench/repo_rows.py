"""A small SWE-bench row around a git repository made in a test's folder: the base commit has a
bug, a later commit fixes it (and is tagged), and the work tree holds an uncommitted edit and
an untracked file, none of which may reach the sandbox."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from environments.swebench.snapshot import make_eval_script

IDENTITY = {
    "GIT_AUTHOR_NAME": "Octo",
    "GIT_AUTHOR_EMAIL": "octo@example.invalid",
    "GIT_COMMITTER_NAME": "Octo",
    "GIT_COMMITTER_EMAIL": "octo@example.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": "/usr/bin:/bin",
}
BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from calc.ops import add\n\n\ndef test_add_zero():\n    assert add(2, 0) == 2\n"
NEW_TEST = "\n\ndef test_add_positive():\n    assert add(2, 3) == 5\n"


@dataclass(frozen=True)
class RepoRow:
    row: dict
    repo: Path
    base_commit: str
    later_commit: str


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=repo, env=IDENTITY, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def make_repo_row(root: Path, *, python: str = "python3") -> RepoRow:
    """A repository at ``root/repo`` and its row (``repo_snapshot: "repo"``); the eval script
    runs ``python -m pytest``."""
    repo = root / "repo"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(BUGGY)
    (repo / "tests" / "test_ops.py").write_text(TESTS)
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "init", "-q", "-b", "trunk")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "calc" / "ops.py").write_text(FIXED)
    gold = git(repo, "diff") + "\n"
    git(repo, "checkout", "-q", "--", ".")
    (repo / "tests" / "test_ops.py").write_text(TESTS + NEW_TEST)
    test_patch = git(repo, "diff") + "\n"
    git(repo, "checkout", "-q", "--", ".")
    (repo / "calc" / "ops.py").write_text(FIXED)
    git(repo, "commit", "-q", "-am", "the fix, after the base commit")
    git(repo, "tag", "v2")
    later = git(repo, "rev-parse", "HEAD")
    (repo / "calc" / "ops.py").write_text(FIXED + "# uncommitted\n")
    (repo / "notes.txt").write_text("untracked\n")
    command = f"{python} -m pytest -rA -p no:cacheprovider tests/test_ops.py"
    row = {
        "instance_id": "octo__calc-1",
        "repo": "octo/calc",
        "base_commit": base,
        "patch": gold,
        "test_patch": test_patch,
        "problem_statement": "add() subtracts its arguments",
        "version": "1.0",
        "FAIL_TO_PASS": json.dumps(["tests/test_ops.py::test_add_positive"]),
        "PASS_TO_PASS": json.dumps(["tests/test_ops.py::test_add_zero"]),
        "eval_script": make_eval_script(
            base_commit=base,
            test_patch=test_patch,
            test_files=["tests/test_ops.py"],
            test_command=command,
        ),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "repo_snapshot": "repo",
    }
    return RepoRow(row, repo, base, later)


def write_rows(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
