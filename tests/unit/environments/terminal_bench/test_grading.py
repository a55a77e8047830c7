"""Turning test runs and reward files into Grades, for both formats."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from environments.sandboxes.protocol import AgentBrokeSandbox, SandboxError
from environments.terminal_bench import load_tasks
from environments.terminal_bench.grading import (
    GraderPaths,
    grade_harbor,
    grade_tb1,
    own,
    parse_pytest_summary,
    parse_reward_json,
)

from .fakes import ScriptedSandbox, result

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"
SUMMARY = """..F
=========================== short test summary info ============================
PASSED tests/test_outputs.py::test_a
PASSED tests/test_outputs.py::test_b[x]
FAILED tests/test_outputs.py::test_c - assert 1 == 2
1 failed, 2 passed in 0.10s
"""


def test_pytest_summary_is_parsed() -> None:
    assert parse_pytest_summary(SUMMARY) == {
        "tests/test_outputs.py::test_a": "PASSED",
        "tests/test_outputs.py::test_b[x]": "PASSED",
        "tests/test_outputs.py::test_c": "FAILED",
    }
    assert parse_pytest_summary("no summary here\nPASSED x") == {}


def test_tb1_reward_needs_every_listed_test_to_pass() -> None:
    failed = grade_tb1(result(SUMMARY, 1), timeout=60)
    assert failed.reward == 0.0 and not failed.infra_failure
    assert failed.details["tests"]["tests/test_outputs.py::test_c"] == "FAILED"
    passing = SUMMARY.replace("FAILED tests/test_outputs.py::test_c - assert 1 == 2", "")
    assert grade_tb1(result(passing, 0), timeout=60).reward == 1.0


def test_tb1_without_pytest_output_uses_the_exit_code() -> None:
    assert grade_tb1(result("all good", 0), timeout=60).reward == 1.0
    assert grade_tb1(result("check failed", 3), timeout=60).reward == 0.0


def test_a_test_run_past_its_timeout_scores_zero_and_says_so() -> None:
    grade = grade_tb1(result("....", None, timed_out=True), timeout=20)
    assert grade.reward == 0.0 and not grade.infra_failure
    assert grade.details["timed_out"] is True
    assert "20 s timeout" in grade.details["reason"]
    sandbox = ScriptedSandbox({"/logs/verifier/reward.txt": "1"})
    paths = GraderPaths("/tests", "/logs/verifier")
    late = grade_harbor(sandbox, paths, result("", None, timed_out=True), timeout=20)
    assert late.reward == 0.0 and late.details["timed_out"] is True


@pytest.mark.parametrize(("text", "reward"), [("1\n", 1.0), ("0", 0.0), (" 0.25 \n", 0.25)])
def test_reward_txt(text: str, reward: float) -> None:
    sandbox = ScriptedSandbox({"/logs/verifier/reward.txt": text})
    grade = grade_harbor(sandbox, GraderPaths("/tests", "/logs/verifier"), result("", 0), 30)
    assert grade.reward == reward and not grade.infra_failure


def test_reward_json_mean_of_metrics_with_all_metrics_in_details() -> None:
    sandbox = ScriptedSandbox(
        {"/logs/verifier/reward.json": '{"valid": 1, "total": 0.5, "top": 0}'}
    )
    grade = grade_harbor(sandbox, GraderPaths("/tests", "/logs/verifier"), result("", 0), 30)
    assert grade.reward == pytest.approx(0.5)
    assert grade.details["metrics"] == {"valid": 1.0, "total": 0.5, "top": 0.0}


def test_reward_json_reward_key_wins() -> None:
    assert parse_reward_json('{"reward": 0.9, "speed": 0.1}') == (
        0.9,
        {"reward": 0.9, "speed": 0.1},
    )


def test_reward_json_side_metrics_need_only_be_finite_when_a_reward_is_given() -> None:
    assert parse_reward_json('{"reward": 1, "num_tests": 12}') == (
        1.0,
        {"reward": 1.0, "num_tests": 12.0},
    )


def test_reward_txt_is_read_before_reward_json() -> None:
    sandbox = ScriptedSandbox(
        {"/logs/verifier/reward.txt": "0", "/logs/verifier/reward.json": '{"reward": 1}'}
    )
    grade = grade_harbor(sandbox, GraderPaths("/tests", "/logs/verifier"), result("", 0), 30)
    assert grade.reward == 0.0


def test_grader_uses_workspace_folders_when_root_is_read_only() -> None:
    task = load_tasks(FIXTURES / "harbor" / "sales-report").get("sales-report")

    class ReadOnlyRoot(ScriptedSandbox):
        def execute(self, cmd: str, timeout: float):
            self.commands.append(cmd)
            if "mkdir -p /tests" in cmd:
                return result("mkdir: cannot create directory '/tests': Read-only", 1)
            if cmd == own("cat /app/.thundersync-grader/logs/verifier/reward.json"):
                return result('{"a": 1, "b": 0}', 0)
            if cmd.startswith(own("cat ")):  # any other file is missing
                return result("", 1)
            return result("", 0)

    sandbox = ReadOnlyRoot()
    grade = task.grade(sandbox)
    assert grade.reward == 0.5, grade.details
    assert {dst for _, dst in sandbox.uploads} == {
        "/app/.thundersync-grader/tests/test.sh",
        "/app/.thundersync-grader/tests/checks.py",
        "/app/.thundersync-grader/tests/score.py",
    }
    run = next(c for c in sandbox.commands if c.endswith("tests/test.sh"))
    assert "TEST_DIR=/app/.thundersync-grader/tests" in run
    assert "VERIFIER_DIR=/app/.thundersync-grader/logs/verifier" in run
    assert "TMPDIR=" in run


def test_tb1_grade_uploads_tests_and_run_tests_script() -> None:
    task = load_tasks(FIXTURES / "tb1" / "sales-report").get("sales-report")
    sandbox = ScriptedSandbox()
    task.grade(sandbox)
    assert sorted(dst for _, dst in sandbox.uploads) == [
        "/tests/checks.py",
        "/tests/run-tests.sh",
        "/tests/test_outputs.py",
    ]
    assert any("TEST_DIR=/tests" in c and "run-tests.sh" in c for c in sandbox.commands)


def test_a_grader_that_cannot_run_is_an_infra_failure() -> None:
    task = load_tasks(FIXTURES / "tb1" / "sales-report").get("sales-report")

    class Broken(ScriptedSandbox):
        def upload(self, src: Path, dst: str) -> None:
            raise SandboxError("container vanished")

    grade = task.grade(Broken())
    assert grade.infra_failure and grade.reward == 0.0
    assert "container vanished" in grade.details["error"]


class LateServiceDeath(ScriptedSandbox):
    """A sandbox with a sidecar whose death its engine reports only after the verifier has
    started (the check before grading still read it running): it died before grading began
    (``during_verifier`` False: at the end of the agent's turn) or while the tests ran."""

    def __init__(self, files: dict[str, str], *, during_verifier: bool) -> None:
        super().__init__(files)
        self.checks: list[float | None] = []
        self.during_verifier = during_verifier
        self.died_at = None if during_verifier else time.time()

    def execute(self, cmd: str, timeout: float):
        if self.during_verifier and cmd.endswith("tests/test.sh") and self.died_at is None:
            self.died_at = time.time()
        return super().execute(cmd, timeout)

    def service(self, name: str) -> None:
        return None

    def check_services(self, until: float | None = None) -> None:
        self.checks.append(until)
        reported = any(c.endswith("tests/test.sh") for c in self.commands)
        if reported and self.died_at is not None and (until is None or self.died_at < until):
            raise AgentBrokeSandbox("service kv stopped: it exited (code 7) during the episode")


@pytest.mark.parametrize("reward", ["0", "1"])
def test_a_service_dead_before_grading_but_reported_after_the_verifier_scores_zero(
    reward: str,
) -> None:
    """Whatever the verifier said, it could not reach the service, which the agent's requests
    did: 0, never an episode excluded from training."""
    task = load_tasks(FIXTURES / "harbor" / "sales-report").get("sales-report")
    sandbox = LateServiceDeath({"/logs/verifier/reward.txt": reward}, during_verifier=False)
    grade = task.grade(sandbox)
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert "service kv stopped" in grade.details["agent_failure"]
    ((until,),) = [sandbox.checks]
    assert until is not None and sandbox.died_at < until <= time.time()


def test_a_service_that_dies_while_the_verifier_runs_leaves_the_verifiers_grade() -> None:
    task = load_tasks(FIXTURES / "harbor" / "sales-report").get("sales-report")
    sandbox = LateServiceDeath({"/logs/verifier/reward.txt": "1"}, during_verifier=True)
    grade = task.grade(sandbox)
    assert (grade.reward, grade.infra_failure) == (1.0, False), grade.details
    assert sandbox.died_at is not None and len(sandbox.checks) == 1


class AgentBrokeMkdir(ScriptedSandbox):
    """``mkdir`` fails (the agent deleted it or made the workspace read-only)."""

    def execute(self, cmd: str, timeout: float):
        self.commands.append(cmd)
        if "mkdir" in cmd:
            return result("mkdir: cannot create directory: Permission denied", 1)
        return result("", 0)


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_grader_folders_the_agent_broke_score_zero_not_infra(fmt: str) -> None:
    task = load_tasks(FIXTURES / fmt / "sales-report").get("sales-report")
    sandbox = AgentBrokeMkdir()
    grade = task.grade(sandbox)
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert grade.details["grader_setup_failed"] is True
    assert "Permission denied" in grade.details["reason"]
    assert not sandbox.uploads
    assert not any("test.sh" in c or "run-tests.sh" in c for c in sandbox.commands)


def test_grader_removes_an_agent_made_fallback_folder_first() -> None:
    task = load_tasks(FIXTURES / "harbor" / "sales-report").get("sales-report")
    sandbox = ScriptedSandbox()
    task.grade(sandbox)
    first = sandbox.commands[0]
    for folder in ("/tests", "/logs/verifier"):  # emptied in place: they may be mount points
        assert f"find {folder} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +" in first
        assert f"rm -f {folder};" in first and f"rm -rf {folder} " not in first

    class ReadOnlyRoot(ScriptedSandbox):
        def execute(self, cmd: str, timeout: float):
            self.commands.append(cmd)
            return result("read-only", 1) if "mkdir -p /tests" in cmd else result("", 0)

    sandbox = ReadOnlyRoot()
    task.grade(sandbox)
    fallback = sandbox.commands[1]
    root = "/app/.thundersync-grader"
    assert f"find {root} -type d -exec chmod u+rwx" in fallback
    assert fallback.index(f"rm -rf {root}") < fallback.index("mkdir -p")


def test_a_grader_whose_sandbox_fails_to_run_mkdir_is_an_infra_failure() -> None:
    task = load_tasks(FIXTURES / "harbor" / "sales-report").get("sales-report")

    class Dead(ScriptedSandbox):
        def execute(self, cmd: str, timeout: float):
            raise SandboxError("bwrap could not set up the sandbox")

    grade = task.grade(Dead())
    assert grade.infra_failure and grade.reward == 0.0
    assert "could not set up" in grade.details["error"]


@pytest.mark.parametrize(
    "text",
    ['{"reward": 1' + "0" * 400 + "}", '{"reward": 1' + "0" * 5000 + "}", "[" * 100_000],
    ids=["401-digit-integer", "5001-digit-integer", "deep-nesting"],
)
def test_an_absurd_reward_json_scores_zero_not_infra(text: str) -> None:
    """A 401-digit integer overflowed float() and escaped as an OverflowError (an episode
    dropped as an infrastructure failure); what a verifier writes is the agent's to steer."""
    sandbox = ScriptedSandbox({"/logs/verifier/reward.json": text})
    grade = grade_harbor(sandbox, GraderPaths("/tests", "/logs/verifier"), result("", 0), 30)
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert "reward.json" in grade.details["reward_error"]
