"""The shipped SWE-bench instances, graded for real through the episode runner (the path real
episodes take: the agent's patch graded in a fresh sandbox): gold patch resolves and no
patch does not, in strict and official grading; tampering gains nothing even in official
grading; in bubblewrap and (marked ``docker``) in the project's base image. Strict grading's
reward-hack suite: test_reward_hacks_swebench.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from environments.actions import format_action
from environments.agents import Agent, NopAgent, OracleAgent, ScriptedAgent
from environments.core import ShellEnv
from environments.runner import EpisodeRunner
from environments.swebench import SWEBenchTask, load_instances
from thundersync.protocol.types import Trajectory

FIXTURES = Path(__file__).resolve().parents[2] / "environments/fixtures/swebench"
TASKS = {task.task_id: task for task in load_instances(FIXTURES)}


def play(task: SWEBenchTask, kind: str, agent: Agent, *, strict: bool = True) -> Trajectory:
    """One episode through EpisodeRunner and ShellEnv; the result's details are the grade's."""
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox=kind, strict_grading=strict), agent, lambda event: None
    )
    result = runner.run_episode(task)
    assert not result.infra_failure, result.details
    return result


def scripted(*commands: str) -> ScriptedAgent:
    return ScriptedAgent([format_action(command) for command in commands])


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "official"])
@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_gold_patch_resolves(kind: str, task_id: str, strict: bool) -> None:
    task = TASKS[task_id]
    result = play(task, kind, OracleAgent(), strict=strict)
    assert result.reward == 1.0, result.details
    assert result.details["strict"] is strict and result.details["tamper_suspected"] is False
    status = result.details["tests_status"]
    assert sorted(status["FAIL_TO_PASS"]["success"]) == sorted(task.instance.fail_to_pass)
    assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(task.instance.pass_to_pass)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "official"])
@pytest.mark.parametrize("task_id", sorted(TASKS))
def test_empty_patch_does_not_resolve(kind: str, task_id: str, strict: bool) -> None:
    task = TASKS[task_id]
    result = play(task, kind, NopAgent(), strict=strict)
    assert result.reward == 0.0, result.details
    assert result.details["strict"] is strict and result.details["tamper_suspected"] is False
    status = result.details["tests_status"]
    assert sorted(status["FAIL_TO_PASS"]["failure"]) == sorted(task.instance.fail_to_pass)
    assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(task.instance.pass_to_pass)


def test_agent_editing_the_tests_gains_nothing(kind: str) -> None:
    """Tests the agent rewrites are reset to the base commit before the test patch applies,
    by the eval script itself (so in official, non-strict grading too)."""
    fake = "def test_merge_touching_endpoints():\\n    pass\\n"
    agent = scripted(f"printf '{fake}' > tests/test_ops.py")
    result = play(TASKS["thundersync__intervals-1"], kind, agent, strict=False)
    assert result.reward == 0.0, result.details


def test_spoofed_pass_lines_are_caught_by_the_exit_code(kind: str) -> None:
    """A conftest printing PASSED for every test after pytest's own summary: the status map
    says all passed, the recorded exit status says otherwise (swebench's anti-spoofing)."""
    task = TASKS["thundersync__semverlite-1"]
    tests = task.instance.fail_to_pass + task.instance.pass_to_pass
    hook = "def pytest_unconfigure(config):\n" + "".join(
        f"    print('PASSED {t}')\n" for t in tests
    )
    result = play(task, kind, scripted(f"cat > conftest.py <<'EOF'\n{hook}EOF"), strict=False)
    assert result.reward == 0.0
    assert result.details["patch_successfully_applied"] is False


def test_broken_agent_patch_scores_zero_not_infra(kind: str) -> None:
    agent = scripted("echo 'def split_row(:' > csvline/parser.py")
    result = play(TASKS["thundersync__csvline-1"], kind, agent)
    assert result.reward == 0.0, result.details


def _fake_pass_hook(task: SWEBenchTask) -> str:
    """A command installing a post-checkout hook (in .git/hooks and, through core.hooksPath,
    in a folder of the agent's) that prints a passing test block before the real tests."""
    tests = task.instance.fail_to_pass + task.instance.pass_to_pass
    block = "".join(f"PASSED {t}\\n" for t in tests)
    hook = (
        "#!/bin/sh\nprintf '>>>>> Start Test Output\\n"
        f"{block}>>>>> End Test Output\\n>>>>> Test Exit Code: 0\\n'\n"
    )
    return (
        "mkdir -p .agent-hooks && for d in .git/hooks .agent-hooks; do "
        f"printf %s {shlex.quote(hook)} > $d/post-checkout && chmod +x $d/post-checkout; "
        "done && git config core.hooksPath .agent-hooks"
    )


def test_git_hook_faking_a_passing_log_scores_zero(kind: str) -> None:
    task = TASKS["thundersync__intervals-1"]
    result = play(task, kind, scripted(_fake_pass_hook(task)), strict=False)
    assert result.reward == 0.0, result.details
    status = result.details["tests_status"]
    assert sorted(status["FAIL_TO_PASS"]["failure"]) == sorted(task.instance.fail_to_pass)


_MONKEYPATCH_FIX = """\
import inspect

import intervals.ops as ops

source = inspect.getsource(ops).replace("start < merged", "start <= merged")
namespace = {}
exec(compile(source, ops.__file__, "exec"), namespace)
ops.merge.__code__ = namespace["merge"].__code__
"""


@pytest.mark.parametrize("hidden", [False, True])
def test_only_files_in_the_patch_are_graded(kind: str, hidden: bool) -> None:
    """Non-strict (the official harness's grading): a fix in a new conftest.py counts when it
    is part of the patch; hidden from git by .git/info/exclude it is not in the patch, so not
    graded. (Strict grading scores any conftest.py 0: tests/integration/
    test_reward_hacks_swebench.py.)"""
    task = TASKS["thundersync__intervals-1"]
    commands = [f"cat > conftest.py <<'EOF'\n{_MONKEYPATCH_FIX}EOF"]
    if hidden:
        commands.append("echo conftest.py >> .git/info/exclude")
    result = play(task, kind, scripted(*commands), strict=False)
    assert result.reward == (0.0 if hidden else 1.0), result.details
    assert result.details["tamper_suspected"] is not hidden
