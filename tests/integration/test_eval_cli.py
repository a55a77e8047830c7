"""``thundersync eval`` end to end: the toy suite, and every shipped suite folder in bwrap and
in Docker."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import in_sandboxes
from thundersync.cli import main
from thundersync.cli_output import without_startup_lines
from thundersync.protocol.events import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "environments" / "fixtures"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")


def run_json(capsys, *argv: str) -> dict:
    assert main(["eval", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@needs_bwrap
def test_oracle_scores_one_on_the_toy_suite_and_writes_the_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    report = run_json(capsys, "--suite", "toy-sum", "--agent", "oracle", "--out", str(out))
    assert report["mean_reward"] == 1.0
    assert len(report["tasks"]) == 8
    for row in report["tasks"]:
        assert {"task_id", "reward", "infra_failure"} <= row.keys()
        assert row["reward"] == 1.0 and row["infra_failure"] is False
    assert json.loads((out / "results.json").read_text()) == report
    assert json.loads((out / "config.json").read_text())["agent"] == "oracle"
    events = read_jsonl(out / "events.jsonl")
    assert sum(e["event"] == "RewardReady" for e in events) == 8
    assert sum(e["event"] == "TurnCompleted" for e in events) == 8 * 4


@pytest.mark.slow
@needs_bwrap
def test_the_console_script_path_runs_in_a_fresh_process():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "thundersync.cli",
            "eval",
            "--suite",
            "toy-sum",
            "--agent",
            "oracle",
            "--json",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mean_reward"] == 1.0


@needs_bwrap
def test_nop_scores_zero_on_the_toy_suite_and_reports_per_task(capsys):
    report = run_json(capsys, "--suite", "toy-sum", "--agent", "nop", "--concurrency", "4")
    assert report["mean_reward"] == 0.0
    assert [row["reward"] for row in report["tasks"]] == [0.0] * 8


@needs_bwrap
def test_k_attempts_per_task(capsys):
    report = run_json(capsys, "--suite", "toy-sum", "--agent", "oracle", "-k", "2")
    assert all(len(row["attempts"]) == 2 for row in report["tasks"])
    ids = {a["episode_id"] for row in report["tasks"] for a in row["attempts"]}
    assert len(ids) == 16


@needs_bwrap
def test_the_human_report_ends_with_its_summary_in_80_columns(capsys):
    assert main(["eval", "--suite", "toy-sum", "--agent", "oracle"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "eval: mean reward 1.000 over 8/8 tasks; 0/8 attempts infra-failed"
    assert all(len(line) <= 80 for line in lines)


@needs_bwrap
def test_progress_lines_appear_in_a_pipe(monkeypatch, capsys):
    from thundersync import cli_output

    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.01)
    assert main(["eval", "--suite", "toy-sum", "--agent", "oracle"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith("eval: ") and "/8 attempts, " in line for line in err), err


def test_a_run_whose_every_attempt_is_an_infra_failure_exits_1(monkeypatch, tmp_path, capsys):
    """What ``make demo`` did on a machine without bubblewrap, with the up-front check
    bypassed: every episode fails in the runner, and that is not a green run."""
    from environments.sandboxes import bwrap
    from harness import eval as harness_eval

    monkeypatch.setattr(bwrap, "BWRAP", str(tmp_path / "no-such-bwrap"))
    monkeypatch.setattr(harness_eval, "sandbox_problem", lambda kind: None)
    assert main(["eval", "--suite", "tb1-mini", "--agent", "oracle", "--json"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["num_attempts"] == 6 and report["num_infra_failed_attempts"] == 6
    assert captured.err.splitlines()[-1].startswith("eval: FAILED: all 6 attempts were infra")


def test_missing_bubblewrap_is_a_clear_error(monkeypatch, tmp_path, capsys):
    from environments.sandboxes import bwrap

    monkeypatch.setattr(bwrap, "BWRAP", str(tmp_path / "no-such-bwrap"))
    assert main(["eval", "--suite", "tb1-mini", "--agent", "oracle"]) == 2
    captured = capsys.readouterr()
    assert "apt-get install bubblewrap" in captured.err and captured.out == ""


def test_an_unknown_suite_is_a_clear_error(capsys):
    assert main(["eval", "--suite", "no-such-suite", "--agent", "oracle"]) == 2
    err = capsys.readouterr().err
    assert "unknown suite 'no-such-suite'" in err and "toy-sum" in err


def test_an_unrecognised_folder_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["eval", "--suite", str(tmp_path), "--agent", "nop"]) == 2
    assert "unrecognised suite folder" in capsys.readouterr().err


SHIPPED = {
    "swebench": (FIXTURES / "swebench", "environments.swebench"),
    "tb1": (FIXTURES / "terminal_bench" / "tb1", "environments.terminal_bench"),
    "harbor": (FIXTURES / "terminal_bench" / "harbor", "environments.terminal_bench"),
}


SUITE_CASES = [
    (suite, agent, expected, strict)
    for suite in sorted(SHIPPED)
    for agent, expected in [("oracle", 1.0), ("nop", 0.0)]
    for strict in (False, True)
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sandbox", "suite", "agent", "expected", "strict"),
    in_sandboxes(
        SUITE_CASES,
        docker=lambda case: case[3],
        ids=lambda case: f"{case[0]}-{case[1]}-{'strict' if case[3] else 'default'}",
    ),
)
def test_shipped_suite_folders_score_oracle_one_and_nop_zero(
    suite, agent, expected, strict, sandbox, capsys
):
    """In both grading modes: strict grading's rules (docs/design.md §6) flag nothing an honest
    solution does, and its fresh sandbox gives no ``nop`` agent a pass. In Docker, strict
    grading (its fresh sandboxes, the engine's archive): default grading there is the
    Terminal-Bench hacks' lenient cases'."""
    folder, loader = SHIPPED[suite]
    assert importlib.util.find_spec(loader) is not None and folder.is_dir()
    flags = ["--sandbox", sandbox, "--concurrency", "2", *(["--strict"] if strict else [])]
    report = run_json(capsys, "--suite", str(folder), "--agent", agent, *flags)
    suspected = {
        row["task_id"]: attempt["tamper_reasons"]
        for row in report["tasks"]
        for attempt in row["attempts"]
        if attempt.get("tamper_suspected")
    }
    assert suspected == {}
    failures = {
        row["task_id"]: row["attempts"][0].get("error")
        for row in report["tasks"]
        if row["infra_failure"]
    }
    assert failures == {}
    assert {row["task_id"]: row["reward"] for row in report["tasks"]} == {
        row["task_id"]: expected for row in report["tasks"]
    }
    assert report["mean_reward"] == expected


def test_docker_without_a_daemon_is_a_clear_error(monkeypatch, capsys):
    import environments.sandboxes

    monkeypatch.setattr(environments.sandboxes, "docker_available", lambda: False)
    assert main(["eval", "--suite", "toy-sum", "--agent", "nop", "--sandbox", "docker"]) == 2
    assert "no Docker daemon" in capsys.readouterr().err


def _result(task_id: str, reward: float, infra: bool, episode: str):
    from thundersync.protocol.types import Trajectory

    details = {"error": "SandboxError: died"} if infra else {}
    stop = "error" if infra else "submitted"
    return Trajectory(episode, "g", 2, task_id, (), (), reward, infra, stop, details)


def test_infra_failures_are_reported_and_excluded_from_the_mean():
    from harness.eval import EvalConfig, build_report

    groups = [
        [_result("a", 1.0, False, "e0"), _result("a", 0.0, True, "e1")],
        [_result("b", 0.0, True, "e2"), _result("b", 0.0, True, "e3")],
        [_result("c", 0.0, False, "e4"), _result("c", 1.0, False, "e5")],
    ]
    report = build_report(EvalConfig("s", "oracle", "bwrap", 2, 1), groups)
    rows = {row["task_id"]: row for row in report["tasks"]}
    assert rows["a"]["reward"] == 1.0 and not rows["a"]["infra_failure"]
    assert rows["b"]["reward"] is None and rows["b"]["infra_failure"]
    assert rows["b"]["attempts"][0]["error"] == "SandboxError: died"
    assert rows["c"]["reward"] == 0.5
    assert report["mean_reward"] == 0.75 and report["num_infra_failures"] == 1
    assert report["num_attempts"] == 6 and report["num_infra_failed_attempts"] == 3


PLUGIN_DIR = ROOT / "tests" / "fixtures" / "plugin_env"


def _eval_plugin(plugin: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin), str(ROOT)]))
    return subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "eval", *argv, "--no-leaderboard"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@needs_bwrap
def test_a_plugins_env_is_evaluated_by_id_as_a_new_user_would(tmp_path):
    """A third-party package's env, named by its id: oracle 1, nop 0, through the real CLI.
    It declares no held-out split: the output says its training tasks were evaluated, each
    once (not its one task drawn twice)."""
    scores = {}
    for agent in ("oracle", "nop"):
        done = _eval_plugin(
            PLUGIN_DIR, "--env", "demoplugin/Greet-v0", "--tasks", "2", "--agent", agent, "--json"
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        scores[agent] = report["mean_reward"]
        assert report["split"] == "train" and [r["task_id"] for r in report["tasks"]] == ["greet"]
        note = (
            "demoplugin/Greet-v0 declares no held-out split: evaluating its training tasks "
            "(scores are not held-out); its train split has 1 task(s), fewer than the 2 "
            "asked"
        )
        assert report["split_note"] == note
        assert f"eval: {note}" in done.stderr
    assert scores == {"oracle": 1.0, "nop": 0.0}


V1_PLUGIN_DIR = ROOT / "tests" / "fixtures" / "plugin_env_v1"


@needs_bwrap
def test_a_plugin_written_for_task_protocol_1_scores_as_before():
    """Its tasks have sandbox_spec(self) and grade(self, sandbox): served through the
    adapter, not an infrastructure failure on every attempt."""
    for agent, expected in (("oracle", 1.0), ("nop", 0.0)):
        done = _eval_plugin(
            V1_PLUGIN_DIR,
            "--env",
            "oldlab/CountLines-v0",
            "--agent",
            agent,
            "--tasks",
            "1",
            "--json",
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["mean_reward"] == expected and report["num_infra_failed_attempts"] == 0


def test_a_plugin_matching_no_task_protocol_is_refused_in_one_line():
    done = _eval_plugin(V1_PLUGIN_DIR, "--env", "oldlab/Broken-v0", "--agent", "oracle")
    assert done.returncode == 2
    lines = without_startup_lines(done.stderr).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert (
        "--env oldlab/Broken-v0: task 'broken' (oldlab.envs.Broken): grade(self) does not "
        "match Task protocol 1: expected grade(self, sandbox)"
    ) in lines[0]


def test_eval_env_scores_the_held_out_split(capsys):
    """ToySum's held-out tasks: distinct, none of them ever drawn by training."""
    from environments.toy import ToySumEnv

    report = run_json(
        capsys,
        "--env",
        "thundersync/ToySum-v0",
        "--agent",
        "oracle",
        "--tasks",
        "12",
        "--env-kwargs",
        '{"tools": "python"}',
        "--no-leaderboard",
    )
    assert report["split"] == "heldout" and report["split_note"] is None
    ids = [row["task_id"] for row in report["tasks"]]
    source = ToySumEnv.task_source()
    assert len(set(ids)) == 12 and all(source.is_heldout(i) for i in ids)
    assert report["mean_reward"] == 1.0


def test_an_unknown_env_id_is_a_clear_error(capsys):
    assert main(["eval", "--env", "nobody/Nothing-v0", "--no-leaderboard"]) == 2
    assert "not a registered env" in capsys.readouterr().err


def test_a_device_the_machine_lacks_is_a_clear_error(tiny_model_dirs, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    checkpoint = str(tiny_model_dirs["qwen3"])
    for device, says in (
        ("cuda", "'cuda' needs 1 CUDA GPU(s); this machine has 0"),
        ("tpu", "expected cpu, cuda or cuda:N"),
    ):
        assert (
            main(
                [
                    "eval",
                    "--env",
                    "thundersync/ToySum-v0",
                    "--checkpoint",
                    checkpoint,
                    "--device",
                    device,
                    "--no-leaderboard",
                ]
            )
            == 2
        )
        assert f"--device: {says}" in capsys.readouterr().err


@needs_bwrap
# Sandboxed tools run an attempt per thread; in-process ones (instant steps) all on one thread.
@pytest.mark.parametrize("env_kwargs", [[], ["--env-kwargs", '{"tools": "python"}']])
def test_a_checkpoint_is_evaluated_with_pass_at_k_and_recorded(
    tiny_model_dirs, tmp_path, capsys, env_kwargs
):
    from leaderboard.store import Store

    out, db = tmp_path / "out", tmp_path / "lb.sqlite"
    checkpoint = str(tiny_model_dirs["qwen3"])
    code = main(
        [
            "eval",
            "--env",
            "thundersync/ToySum-v0",
            "--checkpoint",
            checkpoint,
            "--tasks",
            "3",
            "-k",
            "2",
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
            "--db",
            str(db),
            "--json",
            *env_kwargs,
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["agent"] == "policy" and report["num_attempts"] == 6
    assert set(report["pass_at_k"]) == {"1", "2"}
    assert report["pass_at_k"]["1"] <= report["pass_at_k"]["2"]
    attempts = [json.loads(x) for x in (out / "attempts.jsonl").read_text().splitlines()]
    assert sorted(a["episode_id"] for a in attempts) == [
        f"v-g{t}-e{s}" for t in range(3) for s in range(2)
    ]
    assert all(a["conversation"][0][0] == "user" for a in attempts)
    assert all(len(a["conversation"]) == 2 * a["num_turns"] for a in attempts)
    with Store(db) as store:
        (entry,) = store.entries()
    assert entry.kind == "eval" and entry.checkpoint == str(tiny_model_dirs["qwen3"])
    assert entry.metrics["pass@2"] == report["pass_at_k"]["2"]
