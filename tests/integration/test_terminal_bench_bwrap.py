"""The shipped Terminal-Bench 1 and Harbor tasks, run for real in bubblewrap: the oracle scores
1, doing nothing scores 0, and grading failures are reported as such."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from environments.sandboxes import NeedsDockerError, Sandbox, make_sandbox
from environments.sandboxes.image_build import ALIASES_VARIABLE
from environments.tasks import Grade, GradingContext
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.dockerfile import BASE_IMAGE

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

FIXTURES = Path(__file__).resolve().parents[2] / "environments" / "fixtures" / "terminal_bench"
TASKS = [task for fmt in ("tb1", "harbor") for task in load_tasks(FIXTURES / fmt)]


@contextmanager
def bwrap_sandbox(task: TerminalBenchTask) -> Iterator[Sandbox]:
    sandbox = make_sandbox(task.sandbox_spec("bwrap"), kind="bwrap")
    try:
        task.setup(sandbox)
        yield sandbox
    finally:
        sandbox.close()


def run_agent(
    task: TerminalBenchTask, agent: str, commands: list[str] = (), *, strict: bool | None = None
) -> Grade:
    """Grade without a context (None), or strictly or not with fresh sandboxes it closes."""
    made: list[Sandbox] = []

    def fresh() -> Sandbox:
        made.append(make_sandbox(task.sandbox_spec("bwrap"), kind="bwrap"))
        return made[-1]

    context = None if strict is None else GradingContext(fresh_sandbox=fresh, strict=strict)
    try:
        with bwrap_sandbox(task) as sandbox:
            for cmd in task.reference_solution() if agent == "oracle" else commands:
                done = sandbox.execute(cmd, timeout=task.timeout_s)
                assert done.exit_code == 0, done.output[-2000:]
            return task.grade(sandbox, context)
    finally:
        for other in made:
            other.close()


def by_id(fmt: str, task_id: str) -> TerminalBenchTask:
    return next(t for t in TASKS if t.format == fmt and t.task_id == task_id)


def test_a_task_that_hard_codes_published_paths_runs_as_in_docker() -> None:
    """Its solve.sh reads /solution, its test.sh reads /tests and writes
    /logs/verifier/reward.txt: bubblewrap binds each at its real place."""
    task = load_tasks(FIXTURES / "published" / "greeting-file").get("greeting-file")
    oracle, nop = run_agent(task, "oracle"), run_agent(task, "nop")
    assert (oracle.reward, oracle.infra_failure) == (1.0, False), oracle.details
    assert (nop.reward, nop.infra_failure) == (0.0, False), nop.details


def test_a_public_base_image_runs_in_bwrap_through_an_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task = load_tasks(FIXTURES / "published" / "ubuntu-word-count").get("ubuntu-word-count")
    monkeypatch.delenv(ALIASES_VARIABLE, raising=False)
    with pytest.raises(NeedsDockerError, match=f"pass --image-alias ubuntu:24.04={BASE_IMAGE}"):
        run_agent(task, "oracle")
    monkeypatch.setenv(ALIASES_VARIABLE, f"ubuntu:24.04={BASE_IMAGE}")
    oracle, nop = run_agent(task, "oracle"), run_agent(task, "nop")
    assert (oracle.reward, oracle.infra_failure) == (1.0, False), oracle.details
    assert (nop.reward, nop.infra_failure) == (0.0, False), nop.details


def test_published_folders_are_fresh_per_sandbox_and_persist_between_calls() -> None:
    task = by_id("harbor", "sales-report")
    with bwrap_sandbox(task) as first:
        assert (
            first.execute("echo 1 > /logs/verifier/reward.txt && ls /tests /solution", 10).exit_code
            == 0
        )
        assert first.execute("cat /logs/verifier/reward.txt", 10).output == "1\n"
        with bwrap_sandbox(task) as second:
            listing = second.execute("ls -A /tests /solution /logs/verifier", 10).output
            assert listing.split() == ["/logs/verifier:", "/solution:", "/tests:"]


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_multi_metric_task_oracle_and_nop(fmt: str) -> None:
    task = by_id(fmt, "sales-report")
    oracle, nop = run_agent(task, "oracle"), run_agent(task, "nop")
    assert (oracle.reward, oracle.infra_failure) == (1.0, False), oracle.details
    assert (nop.reward, nop.infra_failure) == (0.0, False), nop.details
    if fmt == "harbor":
        assert oracle.details["metrics"] == {
            "valid_json": 1.0,
            "total_revenue": 1.0,
            "revenue_by_region": 1.0,
            "top_product": 1.0,
        }


def test_partial_report_gets_partial_harbor_reward_but_fails_tb1() -> None:
    partial = ['echo \'{"total_revenue": 1370.12, "top_product": "toaster"}\' > report.json']
    harbor = run_agent(by_id("harbor", "sales-report"), "scripted", partial)
    assert harbor.reward == pytest.approx(0.5), harbor.details
    assert harbor.details["metrics"]["revenue_by_region"] == 0.0
    assert run_agent(by_id("tb1", "sales-report"), "scripted", partial).reward == 0.0


@pytest.mark.parametrize("written", ["all good", "nan", "inf", "1e9"])
def test_a_garbage_or_out_of_range_reward_scores_zero_with_the_reason(
    tmp_path: Path, written: str
) -> None:
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "harbor" / "sales-report", task_dir)
    (task_dir / "tests" / "test.sh").write_text(
        f'#!/bin/bash\necho "{written}" > /logs/verifier/reward.txt\n'
    )
    grade = run_agent(load_tasks(task_dir).get("sales-report"), "nop")
    assert (grade.reward, grade.infra_failure) == (0.0, False), grade.details
    assert "reward.txt: expected a" in grade.details["reward_error"]


def test_a_verifier_the_agent_broke_scores_zero_not_infra(tmp_path: Path) -> None:
    """The verifier fails without writing a reward (as when the agent deleted what it needs):
    the agent's 0, never an infra failure that would drop the episode from training."""
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "harbor" / "sales-report", task_dir)
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\necho crashed >&2\nexit 3\n")
    grade = run_agent(load_tasks(task_dir).get("sales-report"), "nop")
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert "neither" in grade.details["reward_error"]


PRANKS = [
    "mkdir -p .thundersync-grader/tests && touch .thundersync-grader/tests/x && "
    "chmod -R 555 .thundersync-grader",
    "ln -s /usr .thundersync-grader",
    "echo not a folder > .thundersync-grader",
]


@pytest.mark.parametrize("prank", PRANKS, ids=["read-only-folder", "symlink", "file"])
def test_an_agent_made_grader_folder_is_replaced(prank: str) -> None:
    task = by_id("harbor", "sales-report")
    oracle = run_agent(task, "scripted", [*task.reference_solution(), prank])
    assert (oracle.reward, oracle.infra_failure) == (1.0, False), oracle.details
    nop = run_agent(task, "scripted", [prank])
    assert (nop.reward, nop.infra_failure) == (0.0, False), nop.details


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_a_read_only_workspace_does_not_stop_grading(fmt: str) -> None:
    """The grader's folders are /tests and /logs/verifier, as in Docker, not the workspace."""
    task = by_id(fmt, "sales-report")
    grade = run_agent(task, "scripted", [*task.reference_solution(), "chmod 555 ."])
    assert (grade.reward, grade.infra_failure) == (1.0, False), grade.details


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_grader_folders_the_agent_broke_score_zero_not_infra(fmt: str) -> None:
    task = by_id(fmt, "sales-report")
    sabotage = "rm -rf /logs/verifier && chmod 555 /logs ."
    grade = run_agent(task, "scripted", [*task.reference_solution(), sabotage])
    assert (grade.reward, grade.infra_failure) == (0.0, False), grade.details
    assert grade.details["grader_setup_failed"] is True
    assert "Permission denied" in grade.details["reason"]


def test_task_with_a_build_step_refuses_bwrap(tmp_path: Path) -> None:
    task_dir = tmp_path / "sort-files"
    shutil.copytree(FIXTURES / "tb1" / "sort-files", task_dir)
    dockerfile = task_dir / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("thundersync/base:bookworm", "ubuntu"))
    task = load_tasks(task_dir).get("sort-files")
    with pytest.raises(NeedsDockerError, match="task sort-files needs Docker: .*'ubuntu'"):
        task.sandbox_spec("bwrap")
    with pytest.raises(NeedsDockerError):
        make_sandbox(task.sandbox_spec(), kind="bwrap")


def test_replayed_build_step_that_writes_outside_the_workspace_needs_docker(
    tmp_path: Path,
) -> None:
    task_dir = tmp_path / "sort-files"
    shutil.copytree(FIXTURES / "harbor" / "sort-files", task_dir)
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN echo x > /usr/local/bin/tool\n")
    task = load_tasks(task_dir).get("sort-files")
    sandbox = make_sandbox(task.sandbox_spec("bwrap"), kind="bwrap")
    try:
        with pytest.raises(NeedsDockerError, match=r"RUN echo x > /usr/local/bin/tool.*failed"):
            task.setup(sandbox)
    finally:
        sandbox.close()


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_a_nop_agent_on_a_slow_task_fails_its_timed_tests_and_scores_zero(fmt: str) -> None:
    """fast-pair-count's tests time the agent's program against what a linear-time program
    needs on the machine now: a nop leaves the slow one, which each test stops and fails,
    well inside the task's test timeout (a loaded machine's margin costs a nop nothing). Every
    shipped task's oracle 1 and nop 0, strict and not, in both sandboxes: ``test_eval_cli.py``'s
    ``test_shipped_suite_folders_score_oracle_one_...``."""
    task = by_id(fmt, "fast-pair-count")
    nop = run_agent(task, "nop", strict=True)
    assert (nop.reward, nop.infra_failure) == (0.0, False), nop.details
    assert not nop.details.get("timed_out")
    assert "count_pairs.py ran past" in nop.details["output"]


def eval_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    from thundersync.cli import main

    assert main(["eval", *argv, "--sandbox", "bwrap", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_eval_runs_published_style_tasks_with_an_alias_and_strict_grading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ALIASES_VARIABLE, raising=False)
    suite, alias = str(FIXTURES / "published"), f"ubuntu:24.04={BASE_IMAGE}"
    out = tmp_path / "run"
    report = eval_json(
        capsys,
        "--suite",
        suite,
        "--agent",
        "oracle",
        "--image-alias",
        alias,
        "--strict",
        "--out",
        str(out),
    )
    # compose-sidecar runs a service beside main: bubblewrap refuses it, naming Docker
    failed = {row["task_id"]: row for row in report["tasks"] if row["infra_failure"]}
    assert (report["mean_reward"], sorted(failed)) == (1.0, ["compose-sidecar"]), report
    assert "needs Docker" in failed["compose-sidecar"]["attempts"][0]["error"]
    config = json.loads((out / "config.json").read_text())
    assert (config["strict"], config["image_aliases"]) == (True, [alias])
    report = eval_json(capsys, "--suite", suite, "--agent", "nop")  # no alias: bwrap refuses
    failed = {row["task_id"]: row for row in report["tasks"] if row["infra_failure"]}
    assert sorted(failed) == ["compose-sidecar", "separate-verifier", "ubuntu-word-count"]
    for task_id in ("separate-verifier", "ubuntu-word-count"):
        assert f"pass --image-alias {alias}" in failed[task_id]["attempts"][0]["error"]


def test_eval_refuses_a_malformed_image_alias(capsys: pytest.CaptureFixture[str]) -> None:
    from thundersync.cli import main

    argv = ["eval", "--suite", "harbor-mini", "--agent", "nop", "--image-alias", "ubuntu"]
    assert main(argv) == 2
    assert "--image-alias: expected PUBLIC=LOCAL" in capsys.readouterr().err


def test_the_env_grades_strictly_by_default_even_with_a_read_only_logs_folder() -> None:
    """ShellEnv's default (training) grading is strict; the agent's work is archived through a
    scratch folder in its work folder when /logs is not writable."""
    from environments.actions import format_action
    from environments.core import ShellEnv

    task = by_id("harbor", "sales-report")
    env = ShellEnv([task], sandbox="bwrap")
    try:
        env.reset(options={"task": task.task_id})
        for command in [*task.reference_solution(), "chmod 555 /logs"]:
            env.step(format_action(command))
        _, reward, terminated, _, info = env.step(format_action("submit"))
    finally:
        env.close()
    assert (terminated, reward, info["infra_failure"]) == (True, 1.0, False), info
    details = info["grade_details"]
    assert details["strict"] is True and details["tamper_suspected"] is False


def test_an_unreadable_work_file_scores_zero_strictly_not_infra() -> None:
    """The engine takes the work out (the host reads it), so an agent's ``chmod 000`` no longer
    stops the export; the file arrives as the agent left it, unreadable to the tests: the
    agent's 0, graded, never an infrastructure failure."""
    task = by_id("harbor", "sales-report")
    made: list[Sandbox] = []

    def fresh() -> Sandbox:
        made.append(make_sandbox(task.sandbox_spec("bwrap"), kind="bwrap"))
        return made[-1]

    with bwrap_sandbox(task) as sandbox:
        for command in [*task.reference_solution(), "chmod 000 report.json"]:
            assert sandbox.execute(command, timeout=60).exit_code == 0
        grade = task.grade(sandbox, GradingContext(fresh_sandbox=fresh, strict=True))
    for other in made:
        other.close()
    assert (grade.reward, grade.infra_failure) == (0.0, False), grade.details
    assert grade.details["tamper_suspected"] is False
    assert grade.details["metrics"]["valid_json"] == 0.0  # the tests ran and could not read it
