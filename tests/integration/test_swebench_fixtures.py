"""The shipped SWE-bench instances, graded for real: gold patch resolves, no patch does not,
in bubblewrap and (marked ``docker``) in the project's base image."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from environments.sandboxes import Sandbox, make_sandbox
from environments.swebench import SWEBenchTask, load_instances

FIXTURES = Path(__file__).resolve().parents[2] / "environments/fixtures/swebench"
TASKS = {task.task_id: task for task in load_instances(FIXTURES)}


KINDS = [
    pytest.param(
        "bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
    ),
    pytest.param("docker", marks=pytest.mark.docker),
]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """The sandbox kind; tests/integration/conftest.py skips ``docker`` loudly without a
    daemon or base image."""
    return request.param


@contextmanager
def open_sandbox(task: SWEBenchTask, kind: str) -> Iterator[Sandbox]:
    sandbox = make_sandbox(task.sandbox_spec(), kind=kind)
    try:
        task.setup(sandbox)
        yield sandbox
    finally:
        sandbox.close()


def run(sandbox: Sandbox, command: str) -> None:
    result = sandbox.execute(command, timeout=60)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_gold_patch_resolves(kind: str, task_id: str) -> None:
    task = TASKS[task_id]
    with open_sandbox(task, kind) as sandbox:
        for command in task.reference_solution():
            run(sandbox, command)
        grade = task.grade(sandbox)
    assert grade.reward == 1.0, grade.details
    assert not grade.infra_failure
    status = grade.details["tests_status"]
    assert sorted(status["FAIL_TO_PASS"]["success"]) == sorted(task.instance.fail_to_pass)
    assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(task.instance.pass_to_pass)


@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_empty_patch_does_not_resolve(kind: str, task_id: str) -> None:
    task = TASKS[task_id]
    with open_sandbox(task, kind) as sandbox:
        grade = task.grade(sandbox)
    assert grade.reward == 0.0, grade.details
    assert not grade.infra_failure
    status = grade.details["tests_status"]
    assert sorted(status["FAIL_TO_PASS"]["failure"]) == sorted(task.instance.fail_to_pass)
    assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(task.instance.pass_to_pass)


def test_agent_editing_the_tests_gains_nothing(kind: str) -> None:
    """Tests the agent rewrites are reset to the base commit before the test patch applies."""
    task = TASKS["thundersync__intervals-1"]
    with open_sandbox(task, kind) as sandbox:
        fake = "def test_merge_touching_endpoints():\\n    pass\\n"
        run(sandbox, f"printf '{fake}' > tests/test_ops.py")
        grade = task.grade(sandbox)
    assert grade.reward == 0.0 and not grade.infra_failure


def test_spoofed_pass_lines_are_caught_by_the_exit_code(kind: str) -> None:
    """A conftest printing PASSED for every test after pytest's own summary: the status map
    says all passed, the recorded exit status says otherwise (swebench's anti-spoofing)."""
    task = TASKS["thundersync__semverlite-1"]
    tests = task.instance.fail_to_pass + task.instance.pass_to_pass
    hook = "def pytest_unconfigure(config):\n" + "".join(
        f"    print('PASSED {t}')\n" for t in tests
    )
    with open_sandbox(task, kind) as sandbox:
        run(sandbox, f"cat > conftest.py <<'EOF'\n{hook}EOF")
        grade = task.grade(sandbox)
    assert grade.reward == 0.0
    assert grade.details["patch_successfully_applied"] is False


def test_broken_agent_patch_scores_zero_not_infra(kind: str) -> None:
    task = TASKS["thundersync__csvline-1"]
    with open_sandbox(task, kind) as sandbox:
        run(sandbox, "echo 'def split_row(:' > csvline/parser.py")
        grade = task.grade(sandbox)
    assert grade.reward == 0.0 and not grade.infra_failure
