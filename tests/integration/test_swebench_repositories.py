"""Snapshots that are a git repository or a git bundle, made in the test, run in real sandboxes
(bubblewrap, and Docker when marked): /testbed is at the real base_commit with no later
history, the gold patch resolves and no patch does not, under strict grading."""

from __future__ import annotations

from pathlib import Path

import pytest

from environments.sandboxes import Sandbox, make_sandbox
from environments.swebench import SWEBenchTask, load_instances
from environments.tasks import Grade, GradingContext
from tests.conftest import SANDBOX_KINDS
from tests.unit.environments.swebench.repo_rows import RepoRow, git, make_repo_row, write_rows


def load(made: RepoRow, source: str) -> SWEBenchTask:
    row = dict(made.row)
    if source == "bundle":
        git(made.repo, "bundle", "create", "-q", "../repo.bundle", "--all")
        row["repo_snapshot"] = "repo.bundle"
    return load_instances(write_rows(made.repo.parent / "rows.jsonl", row)).get("octo__calc-1")


def grade(task: SWEBenchTask, kind: str, sandbox: Sandbox) -> Grade:
    made: list[Sandbox] = []

    def fresh() -> Sandbox:
        made.append(make_sandbox(task.sandbox_spec(kind), kind=kind))
        return made[-1]

    try:
        return task.grade(sandbox, GradingContext(fresh, strict=True))
    finally:
        for each in made:
            each.close()


@pytest.mark.parametrize("kind", SANDBOX_KINDS)
@pytest.mark.parametrize("source", ["repository", "bundle"])
def test_repository_snapshot_in_a_sandbox(tmp_path: Path, kind: str, source: str) -> None:
    made = make_repo_row(tmp_path)  # python3 of the sandbox: the venv's, or the image's
    task = load(made, source)
    sandbox = make_sandbox(task.sandbox_spec(kind), kind=kind)
    try:
        task.setup(sandbox)
        history = sandbox.execute("git log --all --format=%H; git tag; ls", timeout=60)
        assert history.output.split() == [made.base_commit, "calc", "tests"], history.output
        empty = grade(task, kind, sandbox)
        assert empty.reward == 0.0 and not empty.infra_failure, empty.details
        for command in task.reference_solution():
            assert sandbox.execute(command, timeout=60).exit_code == 0
        gold = grade(task, kind, sandbox)
        assert gold.reward == 1.0, gold.details
        assert gold.details["tamper_suspected"] is False
    finally:
        sandbox.close()
