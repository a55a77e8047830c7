"""Snapshots that are git repositories or bundles: used at their real base_commit, with nothing
of the source beyond that commit's history, on a host stand-in for the sandbox."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from environments.sandboxes.protocol import SandboxError
from environments.swebench import SWEBenchTask, load_instances
from environments.swebench.repository import GitBundle, GitRepository, PlainFolder
from environments.tasks import GradingContext, TaskFormatError
from tests.unit.environments.swebench.host_sandbox import FreshSandboxes, SubprocessSandbox
from tests.unit.environments.swebench.repo_rows import (
    BUGGY,
    RepoRow,
    git,
    make_repo_row,
    write_rows,
)


@pytest.fixture
def made(tmp_path: Path) -> RepoRow:
    return make_repo_row(tmp_path / "rows", python=sys.executable)


def load(made: RepoRow, source: str) -> SWEBenchTask:
    """The row with its snapshot as the repository folder or as a bundle of it."""
    row = dict(made.row)
    if source == "bundle":
        git(made.repo, "bundle", "create", "-q", "../repo.bundle", "--all")
        row["repo_snapshot"] = "repo.bundle"
    path = write_rows(made.repo.parent / "rows.jsonl", row)
    return load_instances(path).get("octo__calc-1")


def sandbox_at(task: SWEBenchTask, root: Path) -> SubprocessSandbox:
    root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-r", str(task.sandbox_spec().files), str(root)], check=True)
    return SubprocessSandbox(root)


@pytest.mark.parametrize("source", ["repository", "bundle"])
def test_snapshot_is_checked_out_at_its_real_base_commit(
    made: RepoRow, tmp_path: Path, source: str
) -> None:
    task = load(made, source)
    assert isinstance(task.repo, GitRepository if source == "repository" else GitBundle)
    staged = task.sandbox_spec().files
    assert staged is not None and sorted(p.name for p in staged.iterdir()) == [".git"]
    sandbox = sandbox_at(task, tmp_path / "testbed")
    task.setup(sandbox)
    root = sandbox.root
    assert git(root, "rev-parse", "HEAD") == made.base_commit
    assert git(root, "log", "--all", "--format=%H").split() == [made.base_commit]
    objects = git(root, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)")
    assert made.later_commit not in objects.split()  # not even unreachable
    assert git(root, "tag") == "" and git(root, "remote") == ""
    assert git(root, "status", "--porcelain") == ""
    assert (root / "calc" / "ops.py").read_text() == BUGGY  # not the uncommitted edit
    assert not (root / "notes.txt").exists()


@pytest.mark.parametrize("source", ["repository", "bundle"])
def test_gold_resolves_and_empty_does_not(made: RepoRow, tmp_path: Path, source: str) -> None:
    task = load(made, source)
    for patch, expected in (("empty", 0.0), ("gold", 1.0)):
        sandbox = sandbox_at(task, tmp_path / patch / "testbed")
        task.setup(sandbox)
        if patch == "gold":
            for command in task.reference_solution():
                assert sandbox.execute(command, timeout=60).exit_code == 0
        fresh = FreshSandboxes(tmp_path / patch, task)
        grade = task.grade(sandbox, GradingContext(fresh, strict=True))
        assert grade.reward == expected, grade.details
        assert not grade.infra_failure and not grade.details["tamper_suspected"]


def test_plain_folder_keeps_its_reproducible_commit(tmp_path: Path) -> None:
    fixtures = Path(__file__).resolve().parents[4] / "environments/fixtures/swebench"
    for task in load_instances(fixtures):
        assert isinstance(task.repo, PlainFolder)
        assert task.sandbox_spec().files == task.instance.repo_snapshot


def test_repository_without_the_base_commit_is_refused(made: RepoRow) -> None:
    row = {**made.row, "base_commit": "f" * 40}
    with pytest.raises(TaskFormatError, match="has no commit f{40}") as info:
        load_instances(write_rows(made.repo.parent / "rows.jsonl", row))
    assert info.value.field == "repo_snapshot" and "row 0" in str(info.value)


def test_bundle_needing_other_commits_is_refused(made: RepoRow) -> None:
    git(made.repo, "bundle", "create", "-q", "../thin.bundle", f"{made.base_commit}..trunk")
    (made.repo.parent / "junk.bundle").write_text("not a bundle\n")
    for name, problem in (("thin.bundle", "needs commits"), ("junk.bundle", "not a git bundle")):
        row = {**made.row, "repo_snapshot": name}
        with pytest.raises(TaskFormatError, match=problem) as info:
            load_instances(write_rows(made.repo.parent / "rows.jsonl", row))
        assert info.value.field == "repo_snapshot"


def test_bundle_without_the_base_commit_fails_when_staged(made: RepoRow) -> None:
    """Checked when the sandbox is made (a bundle is read once, then), as an infrastructure
    failure naming the file, the instance and the field."""
    git(made.repo, "bundle", "create", "-q", "../repo.bundle", "--all")
    row = {**made.row, "repo_snapshot": "repo.bundle", "base_commit": "e" * 40}
    path = write_rows(made.repo.parent / "rows.jsonl", row)
    task = load_instances(path).get("octo__calc-1")
    with pytest.raises(SandboxError, match=r"rows.jsonl: instance 'octo__calc-1': field 'repo_s"):
        task.sandbox_spec()


def test_git_folder_outside_the_rows_folder_is_refused(made: RepoRow, tmp_path: Path) -> None:
    """A ``.git`` file (as in a worktree) may point anywhere: the git folder must lie inside
    the rows' folder too."""
    outside = make_repo_row(tmp_path / "elsewhere")
    linked = made.repo.parent / "linked"
    linked.mkdir()
    (linked / ".git").write_text(f"gitdir: {outside.repo / '.git'}\n")
    row = {**outside.row, "repo_snapshot": "linked"}
    with pytest.raises(TaskFormatError, match="git folder .* lies outside") as info:
        load_instances(write_rows(made.repo.parent / "rows.jsonl", row))
    assert info.value.field == "repo_snapshot"
    allowed = load_instances(
        write_rows(made.repo.parent / "rows.jsonl", row), snapshot_root=tmp_path
    )
    assert isinstance(allowed.get("octo__calc-1").repo, GitRepository)
