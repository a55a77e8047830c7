"""A task's reward file (Harbor's /logs/verifier/reward.txt or reward.json): a bad one, or none
at all, scores 0 with its reason, never an infrastructure failure (the agent's code runs inside
the verifier and could otherwise hide its failures from training)."""

from __future__ import annotations

import pytest

from environments.terminal_bench.grading import GraderPaths, grade_harbor

from .fakes import ScriptedSandbox, result


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({"reward.txt": "abc\n"}, "reward.txt: expected a number, got 'abc'"),
        ({"reward.txt": "nan\n"}, "reward.txt: expected a finite number in [0, 1], got nan"),
        ({"reward.txt": "inf"}, "reward.txt: expected a finite number in [0, 1], got inf"),
        ({"reward.txt": "-inf"}, "got -inf"),
        ({"reward.txt": "1e9"}, "reward.txt: expected a number in [0, 1], got 1000000000.0"),
        ({"reward.txt": "-0.5"}, "expected a number in [0, 1], got -0.5"),
        ({"reward.txt": "1e999"}, "got inf"),
        ({"reward.txt": "\x00\xff garbage"}, "reward.txt: expected a number"),
        ({"reward.txt": ""}, "reward.txt: expected a number, got ''"),
        ({"reward.json": "[1, 2]"}, "reward.json: expected a non-empty object"),
        ({"reward.json": "{}"}, "reward.json: expected a non-empty object"),
        ({"reward.json": '{"accuracy": "high"}'}, "metric 'accuracy': expected a number"),
        ({"reward.json": '{"passed": true}'}, "metric 'passed': expected a number"),
        ({"reward.json": "{not json"}, "reward.json: expected JSON"),
        ({"reward.json": '{"reward": NaN}'}, "metric 'reward': expected a finite number"),
        ({"reward.json": '{"reward": Infinity}'}, "metric 'reward': expected a finite number"),
        ({"reward.json": '{"reward": 1e9}'}, "metric 'reward'"),
        ({"reward.json": '{"reward": 1, "tests": NaN}'}, "metric 'tests': expected a finite"),
        ({"reward.json": '{"a": 7, "b": -5}'}, "metric 'a' (averaged into the reward)"),
    ],
    ids=[
        "txt-word",
        "txt-nan",
        "txt-inf",
        "txt-minus-inf",
        "txt-huge",
        "txt-negative",
        "txt-overflow",
        "txt-binary",
        "txt-empty",
        "json-list",
        "json-empty",
        "json-string-metric",
        "json-bool-metric",
        "json-invalid",
        "json-nan",
        "json-infinity",
        "json-huge",
        "json-nan-side-metric",
        "json-metrics-that-cancel",
    ],
)
@pytest.mark.parametrize("exit_code", [0, 1])
def test_a_bad_reward_file_scores_zero_with_the_reason(
    files: dict[str, str], error: str, exit_code: int
) -> None:
    sandbox = ScriptedSandbox(files={f"/logs/verifier/{k}": v for k, v in files.items()})
    paths = GraderPaths("/tests", "/logs/verifier")
    grade = grade_harbor(sandbox, paths, result("ran the tests", exit_code), timeout=30)
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert error in grade.details["reward_error"]
    assert error in grade.details["reason"]


@pytest.mark.parametrize("exit_code", [0, 3])
def test_no_reward_file_scores_zero_whatever_the_verifiers_exit(exit_code: int) -> None:
    paths = GraderPaths("/tests", "/logs/verifier")
    grade = grade_harbor(ScriptedSandbox(), paths, result("ran", exit_code), timeout=30)
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert "neither /logs/verifier/reward.txt nor reward.json" in grade.details["reward_error"]


class LinkedRewardSandbox(ScriptedSandbox):
    """reward.txt is a link (to the verifier's own script descriptor): ``cat`` cannot read it."""

    def execute(self, cmd: str, timeout: float):
        if cmd.startswith("cd /logs/verifier && for f in"):
            self.commands.append(cmd)
            return result("reward.txt\n", 0)
        return super().execute(cmd, timeout)


def test_a_reward_file_that_is_a_link_scores_zero() -> None:
    paths = GraderPaths("/tests", "/logs/verifier")
    sandbox = LinkedRewardSandbox(files={"/logs/verifier/reward.txt": "1"})
    grade = grade_harbor(sandbox, paths, result("ran", 0), timeout=30)
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert "reward.txt: a link or not a regular file" in grade.details["reward_error"]
