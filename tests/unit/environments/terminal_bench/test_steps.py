"""Harbor multi-step tasks without a sandbox: loading ``[[steps]]`` (per-step instruction,
tests over the task's, solution, timeouts, verifier mode), malformed steps, the ``min_reward``
gate and the reward strategies (Harbor 0.26's rules: docs/harbor-0.26-notes.md §2)."""

from __future__ import annotations

import dataclasses
import shutil
import warnings
from pathlib import Path

import pytest

from environments.agents import SUBMIT_ACTION, Message, OracleAgent
from environments.sandboxes.protocol import ExecResult, SandboxError
from environments.task_steps import StepSetupFailed, stepped
from environments.tasks import Grade, TaskFormatError
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.steps import Healthcheck, combine, gate_failure, step_rewards

from .fakes import ScriptedSandbox, result

ROOT = Path(__file__).resolve().parents[4]
MULTI_STEP = ROOT / "environments" / "fixtures" / "terminal_bench" / "multi-step"
HARBOR_14 = ROOT / "tests" / "fixtures" / "harbor-1.4"


def load(folder: Path) -> TerminalBenchTask:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the examples' keys this loader warns of (user, network)
        return load_tasks(folder).get(folder.name)


def graded(value: float, **metrics: float) -> Grade:
    return Grade(value, details={"metrics": metrics} if metrics else {})


def test_the_gate_fixture_loads_its_steps_in_order() -> None:
    task = load(MULTI_STEP / "two-step-gate")
    assert stepped(task) is task and task.num_steps == 2
    assert [s.name for s in task.steps] == ["01-greet", "02-count"]
    assert task.instruction == task.steps[0].instruction  # the first user turn
    assert [s.min_reward for s in task.steps] == [1.0, None]
    assert [s.timeout_s for s in task.steps] == [60.0, 30.0]  # [agent], then the step's own
    second = task.step_task(1)
    assert second.step_index == 1 and second.num_steps == 0 and stepped(second) is None
    assert second.instruction.startswith("A new file `more_names.txt`")
    assert sorted(rel for _, rel in second.test_uploads()) == ["lib.sh", "test.sh"]
    assert "02-count" in str(dict((r, h) for h, r in second.test_uploads())["test.sh"])
    assert [len(commands) for commands in task.reference_steps()] == [1, 1]


def test_harbor_14_examples_load_with_their_gates_and_strategies() -> None:
    mean = load(HARBOR_14 / "ms-two-step-mean")
    assert mean.reward_strategy == "mean" and [s.min_reward for s in mean.steps] == [1.0, None]
    assert [s.test_timeout_s for s in mean.steps] == [120.0, 120.0]
    separate = load(HARBOR_14 / "ms-separate-verifier")
    assert separate.reward_strategy == "final"
    assert separate.steps[0].min_reward == {"correctness": 1.0}
    first, second = (s.verifier for s in separate.steps)
    assert first is not None and first.build_context == separate.steps[0].folder / "tests"
    assert second is not None and second == separate.environment  # a fresh task environment


def _task_dir(tmp_path: Path, toml_tail: str, *, strategy: str = "mean") -> Path:
    task = tmp_path / "steps-task"
    shutil.copytree(MULTI_STEP / "two-step-gate", task)
    (task / "task.toml").write_text(
        f'schema_version = "1.4"\nmulti_step_reward_strategy = "{strategy}"\n'
        "[environment]\nbuild_timeout_sec = 60.0\n" + toml_tail
    )
    return task


def test_a_steps_verifier_timeout_does_not_inherit_the_tasks(tmp_path: Path) -> None:
    folder = _task_dir(
        tmp_path,
        '[verifier]\ntimeout_sec = 5.0\n[[steps]]\nname = "01-greet"\n'
        '[[steps]]\nname = "02-count"\n',
    )
    assert [s.test_timeout_s for s in load(folder).steps] == [600.0, 600.0]  # Harbor's rule


@pytest.mark.parametrize(
    ("tail", "strategy", "field", "problem"),
    [
        ('[[steps]]\nname = "01-greet"\n', "max", "multi_step_reward_strategy", "'mean'"),
        ('[[steps]]\nname = "a/b"\n', "mean", "steps[0].name", "folder name"),
        (
            '[[steps]]\nname = "01-greet"\n[[steps]]\nname = "01-GREET"\n',
            "mean",
            "steps[1].name",
            "duplicate",
        ),
        ('[[steps]]\nname = "03-missing"\n', "mean", "steps/03-missing", "step's folder"),
        (
            '[[steps]]\nname = "01-greet"\nmin_reward = "high"\n',
            "mean",
            "steps[0].min_reward",
            "number",
        ),
        (
            '[[steps]]\nname = "01-greet"\n[steps.verifier]\nenvironment_mode = "x"\n',
            "mean",
            "steps[0].verifier.environment_mode",
            "'shared' or 'separate'",
        ),
        ("steps = []\n", "mean", "steps", "[[steps]]"),
    ],
)
def test_malformed_steps_name_the_field(
    tmp_path: Path, tail: str, strategy: str, field: str, problem: str
) -> None:
    if tail.startswith("steps = []"):  # a top-level key: before the tables
        folder = _task_dir(tmp_path, "", strategy=strategy)
        toml = folder / "task.toml"
        toml.write_text(tail + toml.read_text())
    else:
        folder = _task_dir(tmp_path, tail, strategy=strategy)
    with pytest.raises(TaskFormatError) as err:
        load(folder)
    assert err.value.field == field and problem in str(err.value)


def test_a_step_without_tests_uses_the_tasks_test_sh_or_is_refused(tmp_path: Path) -> None:
    folder = _task_dir(tmp_path, '[[steps]]\nname = "01-greet"\n')
    shutil.rmtree(folder / "steps" / "01-greet" / "tests")
    with pytest.raises(TaskFormatError, match="tests/test.sh"):
        load(folder)
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    step = load(folder).steps[0]
    assert step.test_script == folder / "tests" / "test.sh"


def test_a_multi_step_task_is_graded_only_step_by_step(tmp_path: Path) -> None:
    task = load(MULTI_STEP / "two-step-gate")
    grade = task.grade(object(), None)  # type: ignore[arg-type]
    assert grade.infra_failure and "step_task" in grade.details["error"]


def test_the_float_gate_reads_reward_and_equal_passes() -> None:
    assert gate_failure(None, graded(0.0)) is None
    assert gate_failure(1.0, graded(1.0)) is None
    assert gate_failure(0.5, graded(0.25)) == "reward=0.25 below min_reward 0.5"
    # reward.json without a "reward" key: the float gate finds none (-inf), as Harbor's does
    assert gate_failure(0.5, graded(1.0, score=1.0)) == "reward=-inf below min_reward 0.5"


def test_the_table_gate_checks_every_key_a_missing_one_fails() -> None:
    assert gate_failure({"a": 1.0, "b": 0.5}, graded(0.75, a=1.0, b=0.5)) is None
    assert gate_failure({"a": 1.0, "b": 0.5}, graded(0.6, a=1.0, b=0.2)) == (
        "b=0.2 below min_reward 0.5"
    )
    assert gate_failure({"c": 0.0}, graded(1.0, a=1.0)) == "c=-inf below min_reward 0"
    assert step_rewards(graded(0.0)) == {"reward": 0.0}  # reward.txt, or no usable file


def test_mean_averages_the_graded_steps_per_key_and_final_takes_the_last() -> None:
    grades = [graded(1.0), graded(0.0, reward=0.0, count=1.0)]
    assert combine("mean", grades) == (0.5, {"count": 0.5, "reward": 0.5})
    assert combine("final", grades) == (0.0, {"reward": 0.0, "count": 1.0})
    assert combine("mean", [graded(0.5)]) == (0.5, {"reward": 0.5})  # stopped after step 1
    assert combine("mean", []) == (0.0, {}) == combine("final", [])


def test_combine_steps_reports_each_step_and_a_failed_grading() -> None:
    task = load(MULTI_STEP / "two-step-gate")
    tampered = Grade(0.0, details={"tamper_suspected": True, "tamper_reasons": ["x"]})
    grade = task.combine_steps([graded(1.0), tampered], None)
    assert grade.reward == 0.5 and not grade.infra_failure
    assert [s["name"] for s in grade.details["steps"]] == ["01-greet", "02-count"]
    assert grade.details["tamper_suspected"] is True and grade.details["tamper_reasons"] == ["x"]
    assert task.combine_steps([graded(1.0)], "step 01-greet: below", gated=True).reward == 1.0
    assert task.combine_steps([graded(1.0)], "the episode ended (max_turns)").reward == 0.5
    failed = task.combine_steps([graded(1.0), Grade(0.0, True, {"error": "boom"})], None)
    assert failed.infra_failure and failed.details["error"] == "step 02-count: boom"


def test_the_oracle_plays_each_steps_solution_after_each_submission() -> None:
    task = load(MULTI_STEP / "two-step-gate")
    first, second = task.reference_steps()
    oracle, user = OracleAgent(), Message("user", "")

    def after(*actions: str) -> str:
        messages = [user]
        for action in actions:
            messages += [Message("assistant", action), user]
        return oracle.act(task, messages).text

    assert first[0] in after()
    assert after(f"```bash\n{first[0]}\n```") == SUBMIT_ACTION
    assert second[0] in after(f"```bash\n{first[0]}\n```", SUBMIT_ACTION)
    assert after("x", SUBMIT_ACTION, f"```bash\n{second[0]}\n```") == SUBMIT_ACTION
    assert after("x", SUBMIT_ACTION, "y", SUBMIT_ACTION) == SUBMIT_ACTION  # no third step


class SetupFailsAfter(ScriptedSandbox):
    """Every ``bash <workdir>/setup.sh`` after the first ``ok`` ones exits 1."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        if cmd.startswith("bash ") and cmd.endswith("/setup.sh"):
            self.ok -= 1
            if self.ok < 0:
                self.commands.append(cmd)
                return result("setup: no such file", 1)
        return super().execute(cmd, timeout)


def test_a_failing_setup_sh_is_the_tasks_before_step_1_and_stops_a_later_step(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "two-step-gate"
    shutil.copytree(MULTI_STEP / "two-step-gate", folder)
    (folder / "steps" / "02-count" / "workdir" / "setup.sh").write_text("cat /app/out.txt\n")
    task = load(folder)
    with pytest.raises(SandboxError, match="step 01-greet: setup.sh exited 1"):
        task.setup(SetupFailsAfter(0))  # type: ignore[arg-type]
    sandbox = SetupFailsAfter(1)
    task.setup(sandbox)  # type: ignore[arg-type]
    assert any("tar --no-same-owner -xzf - -C /app" in c for c in sandbox.commands)
    with pytest.raises(StepSetupFailed, match="step 02-count: setup.sh exited 1"):
        task.start_step(sandbox, 1)  # type: ignore[arg-type]
    assert any("; if [ -d /tests ]" in c for c in sandbox.commands)  # emptied first
    # grading's pristine state of step 2 replays its setup as far as it goes
    task.step_task(1).setup(SetupFailsAfter(1))  # type: ignore[arg-type]


class FailsTimes(ScriptedSandbox):
    """The healthcheck command (``check``) fails ``failures`` times, then passes."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        if cmd == "check":
            self.commands.append(cmd)
            self.failures -= 1
            return result("not yet", 1 if self.failures >= 0 else 0)
        return super().execute(cmd, timeout)


def test_a_step_healthcheck_follows_harbors_rule() -> None:
    check = Healthcheck("check", interval_s=1.0, start_period_s=10.0, start_interval_s=2.0)
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    def run(failures: int, retries: int = 3) -> str | None:
        now[0], slept[:] = 0.0, []
        probe = dataclasses.replace(check, retries=retries)
        return probe.failure(FailsTimes(failures), clock=lambda: now[0], sleep=sleep)  # type: ignore[arg-type]

    assert run(0) is None and slept == []  # the first success passes
    assert run(5) is None and slept == [2.0] * 5  # failures inside the start period are free
    failed = run(20)
    assert failed is not None and "exited 1 (3 failures in a row)" in failed
    assert slept == [2.0] * 5 + [1.0, 1.0]  # then 3 failures, 1 s apart
    assert run(20, retries=0) is not None and slept == [2.0] * 5


def test_the_gate_fixture_checks_step_2_before_showing_it(tmp_path: Path) -> None:
    task = load(MULTI_STEP / "two-step-gate")
    check = task.steps[1].healthcheck
    assert check == Healthcheck("test -s /app/more_names.txt", interval_s=1.0, retries=2)
    sandbox = ScriptedSandbox()
    task.start_step(sandbox, 1)  # type: ignore[arg-type]
    assert sandbox.commands[-1] == check.command
    failing = FailsTimes(100)
    failing_task = dataclasses.replace(
        task,
        steps=(
            task.steps[0],
            dataclasses.replace(task.steps[1], healthcheck=Healthcheck("check", interval_s=0.01)),
        ),
    )
    with pytest.raises(StepSetupFailed, match="step 02-count: healthcheck 'check' exited 1"):
        failing_task.start_step(failing, 1)  # type: ignore[arg-type]
    folder = _task_dir(tmp_path, '[[steps]]\nname = "01-greet"\n[steps.healthcheck]\nretries = 1\n')
    with pytest.raises(TaskFormatError, match="steps\\[0\\].healthcheck.command"):
        load(folder)
