"""``thundersync eval``'s report and verdict: strict JSON, attempt counts, exit codes, and the
sandbox prerequisite check (run without any sandbox: ``_run`` is replaced by canned results)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil

import pytest

from environments.sandboxes import bwrap
from harness import eval as harness_eval
from harness.eval import EvalConfig, build_report, report_table, sandbox_problem, summary
from thundersync.cli import main
from thundersync.protocol.types import Trajectory

CONFIG = EvalConfig("s", "oracle", "bwrap", 2, 1)


def result(task_id: str, reward: float, infra: bool, episode: str) -> Trajectory:
    details = {"error": "SandboxError: died\nsecond line"} if infra else {}
    stop = "error" if infra else "submitted"
    return Trajectory(episode, "g", 2, task_id, (), (), reward, infra, stop, details)


def strict_loads(text: str):
    def reject(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=reject)


@pytest.fixture
def canned(monkeypatch):
    """Make ``eval`` return ``groups`` without running a sandbox: (set_groups)."""
    state: dict = {"groups": []}
    monkeypatch.setattr(harness_eval, "sandbox_problem", lambda kind: None)
    monkeypatch.setattr(
        harness_eval, "_run", lambda config, make_env, tasks, out: (state["groups"], None)
    )
    return lambda groups: state.update(groups=groups)


def test_the_report_counts_attempts_and_infra_failed_attempts():
    groups = [
        [result("a", 1.0, False, "e0"), result("a", 0.0, True, "e1")],
        [result("b", 0.0, True, "e2"), result("b", 0.0, True, "e3")],
        [result("c", 0.0, False, "e4"), result("c", 1.0, False, "e5")],
    ]
    report = build_report(CONFIG, groups)
    assert report["num_tasks"] == 3 and report["num_infra_failures"] == 1
    assert report["num_attempts"] == 6 and report["num_infra_failed_attempts"] == 3
    assert report["mean_reward"] == 0.75
    assert summary(report) == (
        0,
        "eval: mean reward 0.750 over 2/3 tasks; 3/6 attempts infra-failed",
    )


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_reward_is_null_with_a_reason_and_scores_zero(bad, canned, tmp_path, capsys):
    canned([[result("a", bad, False, "e0"), result("a", 1.0, False, "e1")]])
    out = tmp_path / "run"
    assert main(["eval", "--suite", "toy-sum", "--json", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    report = strict_loads(captured.out)
    assert strict_loads((out / "results.json").read_text()) == report
    attempt = report["tasks"][0]["attempts"][0]
    assert attempt["reward"] is None and repr(bad) in attempt["reward_invalid"]
    assert report["tasks"][0]["reward"] == 0.5 and report["mean_reward"] == 0.5
    assert report["num_invalid_rewards"] == 1
    assert captured.err.splitlines()[-1].endswith(", 1 non-finite")


def test_a_non_finite_reward_of_an_infra_failure_is_not_counted_as_scored():
    report = build_report(
        CONFIG, [[result("a", math.nan, True, "e0"), result("a", 1.0, False, "e1")]]
    )
    attempt = report["tasks"][0]["attempts"][0]
    assert attempt["reward"] is None and "not scored" in attempt["reward_invalid"]
    assert report["num_invalid_rewards"] == 0 and report["mean_reward"] == 1.0


def test_every_attempt_an_infra_failure_exits_1(canned, capsys):
    canned([[result("a", 0.0, True, "e0")], [result("b", 0.0, True, "e1")]])
    assert main(["eval", "--suite", "toy-sum"]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("eval: FAILED: all 2 attempts were infrastructure failures: Sandbox")
    assert len(last) <= 80


def test_no_attempt_run_exits_1(canned, capsys):
    canned([])
    assert main(["eval", "--suite", "toy-sum", "--json"]) == 1
    captured = capsys.readouterr()
    assert strict_loads(captured.out)["num_attempts"] == 0
    assert captured.err.splitlines()[-1] == "eval: FAILED: no attempt ran"


def test_the_summary_is_the_last_line_and_the_table_fits_80_columns(canned, capsys):
    long_id = "a-task-with-a-rather-long-identifier-" + "x" * 40
    canned([[result(long_id, 1.0, False, "e0")], [result("b", 0.0, True, "e1")]])
    assert main(["eval", "--suite", "toy-sum"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    assert lines[-1] == "eval: mean reward 1.000 over 1/2 tasks; 1/2 attempts infra-failed"
    assert any(
        line.startswith("b ") and "infra failure: SandboxError: died" in line for line in lines
    )


def test_the_table_marks_each_task():
    report = build_report(CONFIG, [[result("a", 1.0, False, "e0")]])  # k=2: passed/scored too
    assert report_table(report)[2].split() == ["a", "1.000", "1/1", "solved"]
    one = build_report(dataclasses.replace(CONFIG, k=1), [[result("a", 1.0, False, "e0")]])
    assert report_table(one)[2].split() == ["a", "1.000", "solved"]


# --- sandbox prerequisites ------------------------------------------------------------------


def test_missing_bubblewrap_is_named_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(bwrap, "BWRAP", str(tmp_path / "no-such-bwrap"))
    problem = sandbox_problem("bwrap")
    assert problem is not None
    assert "not installed" in problem and "apt-get install bubblewrap" in problem
    assert "--sandbox docker" in problem


def test_missing_bubblewrap_exits_2_before_any_task_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bwrap, "BWRAP", str(tmp_path / "no-such-bwrap"))
    ran = []
    monkeypatch.setattr(harness_eval, "_run", lambda *args: ran.append(args) or [])
    assert main(["eval", "--suite", "tb1-mini"]) == 2
    assert ran == []
    err = capsys.readouterr().err
    assert err.startswith("eval: error: --sandbox bwrap: bubblewrap")
    assert "apt-get install bubblewrap" in err


def test_a_bubblewrap_that_cannot_start_a_sandbox_is_caught(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    problem = sandbox_problem("bwrap")
    assert problem is not None and "cannot start a sandbox" in problem
    assert "Permission denied" in problem and "--sandbox docker" in problem


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")
def test_a_working_bubblewrap_passes():
    assert sandbox_problem("bwrap") is None


def test_docker_without_a_daemon_is_named_with_the_fix(monkeypatch):
    import environments.sandboxes

    monkeypatch.setattr(environments.sandboxes, "docker_available", lambda: False)
    problem = sandbox_problem("docker")
    assert problem is not None and "no Docker daemon" in problem


def test_an_attempt_says_why_strict_grading_scored_it_zero():
    """A 0 for tampering or for a sandbox the agent broke reads as such in the report, not as
    a plain failure: the reasons travel with each attempt (bounded)."""
    reasons = ["/app/argparse.py: shadows"] * 50
    details = {"tamper_suspected": True, "tamper_reasons": reasons}
    tampered = Trajectory("e0", "g", 2, "t", (), (), 0.0, False, "submitted", details)
    broken = Trajectory(
        "e1", "g", 2, "t", (), (), 0.0, False, "submitted", {"agent_failure": "bash replaced"}
    )
    report = build_report(CONFIG, [[tampered, broken]])
    first, second = report["tasks"][0]["attempts"]
    assert first["tamper_suspected"] is True
    assert first["tamper_reasons"][0] == "/app/argparse.py: shadows"
    assert len(first["tamper_reasons"]) == 20
    assert second["agent_failure"] == "bash replaced" and "tamper_suspected" not in second


def test_with_k_above_one_the_summary_and_table_show_pass_at_k(canned, capsys):
    # a: 2 of 3 attempts pass; b: none of 3 -> pass@1 = (2/3 + 0)/2, pass@3 = (1 + 0)/2
    canned(
        [
            [
                result("a", 1.0, False, "a0"),
                result("a", 0.0, False, "a1"),
                result("a", 1.0, False, "a2"),
            ],
            [
                result("b", 0.0, False, "b0"),
                result("b", 0.0, False, "b1"),
                result("b", 0.0, False, "b2"),
            ],
        ]
    )
    assert main(["eval", "--suite", "toy-sum", "-k", "3", "--no-leaderboard"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "eval: mean reward 0.333 over 2/2 tasks; 0/6 attempts infra-failed"
    assert lines[-2] == "pass@1 0.333, pass@3 0.500 (unbiased; an attempt passes with reward 1)"
    assert lines[1].split() == ["task", "reward", "passed", "outcome"]
    assert lines[2].split()[:3] == ["a", "0.667", "2/3"] and lines[3].split()[2] == "0/3"
    assert all(len(line) <= 80 for line in lines)


IMAGE_ERROR = (
    "SandboxError: no local image ubuntu:24.04 and no registry to pull it from: pass "
    "--image-alias ubuntu:24.04=thundersync/base:bookworm (or set THUNDERSYNC_IMAGE_ALIASES="
    "ubuntu:24.04=thundersync/base:bookworm) to build on the local base image, if the task "
    "needs nothing else from ubuntu:24.04"
)


def scored(task_id: str, reward: float, details: dict, stop: str = "submitted") -> Trajectory:
    return Trajectory(f"{task_id}-e0", "g", 1, task_id, (), (), reward, False, stop, details)


@pytest.mark.parametrize(
    "details, stop, reason",
    [
        ({"answer": "41", "expected": "42"}, "submitted", "answered 41, expected 42"),
        ({"answer": None, "expected": "42"}, "max_turns", "no answer (expected 42); max_turns"),
        (
            {"timed_out": True, "reason": "the tests ran past their 8 s timeout"},
            "submitted",
            "the tests ran past their 8 s timeout",
        ),
        (
            {"exit_code": 1, "tests": {"test_a": "PASSED", "test_b": "FAILED"}},
            "submitted",
            "failed: test_b",
        ),
        (
            {"resolved": False, "tests_status": {"FAIL_TO_PASS": {"failure": ["t::x"]}}},
            "submitted",
            "not resolved; failed: t::x",
        ),
        ({"tamper_suspected": True, "tamper_reasons": ["conftest.py"]}, "submitted", "tamper"),
        ({}, "submitted", "graded 0 (the grader gave no reason)"),
    ],
)
def test_every_zero_in_the_table_carries_its_reason(details, stop, reason):
    report = build_report(dataclasses.replace(CONFIG, k=1), [[scored("t", 0.0, details, stop)]])
    assert report["tasks"][0]["attempts"][0]["reason"].startswith(reason)
    row = report_table(report)[2]
    assert row.split()[:2] == ["t", "0.000"] and reason in row, row


def test_a_long_reason_is_never_cut_before_the_flag_it_names(canned, capsys):
    """The unmapped-image error names the --image-alias to pass at its end: cut to the
    column, the table kept only ``SandboxError: no local image ubunt...``. A reason too long
    for its column is numbered, and said whole once under the table, within 80 columns."""
    infra = [
        Trajectory(f"e{i}", "g", 1, f"task-{i}", (), (), 0.0, True, "error", {"error": IMAGE_ERROR})
        for i in range(3)
    ]
    canned([[infra[0]], [infra[1]], [infra[2]], [scored("ok", 1.0, {})]])
    assert main(["eval", "--suite", "toy-sum", "--no-leaderboard"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    rows = [line for line in lines if line.startswith("task-")]
    assert len(rows) == 3 and all("infra failure [1]" in row for row in rows), rows
    notes = lines[lines.index(next(x for x in lines if x.startswith("[1] "))) :]
    said = " ".join(line.strip() for line in notes if not line.startswith("eval:"))
    assert IMAGE_ERROR in said.removeprefix("[1] "), said
    assert sum(line.startswith("[") for line in lines) == 1  # said once for the three tasks
