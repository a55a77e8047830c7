"""OpenEnv end to end, offline on loopback: ``thundersync serve`` as its own process serving a
Harbor fixture task to openenv's client (the reference solution scores 1, submitting at once
0, under strict grading) and ToySum to ``thundersync train`` through ``openenv/Remote-v0``;
Ctrl-C stops the server and every session's sandbox goes with it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the interop extra: pip install -e '.[interop]'")

from environments.suites import resolve_suite  # noqa: E402
from tests.integration.training_kit import train  # noqa: E402
from tests.unit.thundersync.test_interop_openenv import client, play, served  # noqa: E402
from thundersync.protocol.events import read_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HARBOR_TASK = ROOT / "environments" / "fixtures" / "terminal_bench" / "harbor" / "sales-report"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
]


def test_an_openenv_client_plays_a_harbor_task_oracle_one_nop_zero():
    (task,) = resolve_suite(HARBOR_TASK)
    kwargs = {"suite": str(HARBOR_TASK)}
    with served("thundersync/TerminalBench-v0", kwargs) as server, client(server) as session:
        first = session.reset(task_id=task.task_id)
        assert first.observation["text"] == task.instruction
        assert first.observation["strict_grading"] is True
        oracle = play(session, task.reference_solution())
        assert (oracle.reward, oracle.observation["infra_failure"]) == (1.0, False), oracle
        assert not oracle.observation["grade_details"].get("tamper_suspected")
        session.reset(task_id=task.task_id)
        assert play(session, []).reward == 0.0


class Serve:
    """``thundersync serve`` as a process of its own on a free loopback port (it prints the
    port it got; ``--port 0`` comes last, so it overrides a port in ``args``), stopped with
    Ctrl-C by its pid on every path out."""

    def __init__(self, *args: str, timeout_s: float = 300.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "thundersync.cli", "serve", *args, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        watchdog = threading.Timer(timeout_s, self.proc.kill)
        watchdog.start()
        try:
            first = self.proc.stdout.readline()  # no polling: the line, or EOF once killed
        finally:
            watchdog.cancel()
        if " at http://127.0.0.1:" not in first:
            self.stop()
            raise AssertionError(f"serve did not start: {first}{self.proc.stderr.read()}")
        self.url = first.split(" at ", 1)[1].split()[0]

    def stop(self) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, err = self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return self.proc.returncode, out, err


def test_train_runs_two_steps_on_toysum_served_over_openenv(tmp_path):
    server = Serve("--env", "thundersync/ToySum-v0")
    try:
        out = tmp_path / "run"
        env_kwargs = json.dumps({"url": server.url})
        small = ["--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "8"]
        train(out, "--env", "openenv/Remote-v0", "--env-kwargs", env_kwargs, "--steps", "2", *small)
    finally:
        code, stdout, stderr = server.stop()
    assert code == 0 and "every session's sandbox removed" in stdout, stdout + stderr
    assert "Traceback" not in stderr, "a client closing its session is no error"
    records = read_jsonl(out / "events.jsonl")
    rewards = [r for r in records if r["event"] == "RewardReady"]
    assert len(rewards) == 2 * 2 * 2
    assert [r for r in rewards if r["infra_failure"]] == []
    started = [r for r in records if r["event"] == "EpisodeStarted"]
    assert all(not r["task_id"].startswith("seed-") for r in started), "the server's task ids"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", "step-000002"]


README = ROOT / "docs" / "guides" / "interop.md"  # the OpenEnv example moved here from README.md


def readme_openenv_commands() -> list[list[str]]:
    """The README's OpenEnv bash block, one argv per ``thundersync`` command."""
    (block,) = [
        b
        for b in re.findall(r"```bash\n(.*?)```", README.read_text(), re.DOTALL)
        if "openenv/Remote-v0" in b
    ]
    argvs = [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()]
    return [words[1:] for words in argvs if words and words[0] == "thundersync"]


def test_the_readme_openenv_example_runs_as_written_with_no_infrastructure_failure(tmp_path):
    """Issue 35: with serve's default 8 sessions, every step of the README's train command
    ended with "8 infrastructure failure(s), not trained on" ("Server at capacity: 8/8
    sessions active"): a step's 16 episodes, and the next step's envs opened ahead, asked for
    more sessions than the server allows. The commands as written (serve on a free port
    instead of 8000, train for 2 steps so that the second step's envs are opened ahead): no
    episode is lost, and train says once why episodes wait."""
    serve, train_argv = readme_openenv_commands()
    assert serve[0] == "serve" and "--max-sessions" not in serve, "the default sessions"
    assert train_argv[0] == "train" and "--tasks-per-step" not in train_argv
    server = Serve(*serve[1:])
    try:
        kwargs = train_argv.index("--env-kwargs") + 1
        assert json.loads(train_argv[kwargs]) == {"url": "http://127.0.0.1:8000"}
        train_argv[kwargs] = json.dumps({"url": server.url})
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        )
        done = subprocess.run(
            [sys.executable, "-m", "thundersync.cli", *train_argv, "--steps", "2"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        code, stdout, stderr = server.stop()
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown
    assert code == 0 and "Traceback" not in stderr, stdout + stderr
    assert "infrastructure failure" not in shown, shown
    said = re.findall(r"train: openenv/Remote-v0 allows 8 sessions at once", done.stderr)
    assert len(said) == 1, done.stderr
    records = read_jsonl(tmp_path / "runs" / "remote" / "events.jsonl")
    rewards = [r for r in records if r["event"] == "RewardReady"]
    assert len(rewards) == 2 * 4 * 4, "train's default 4 tasks x 4 episodes a step"
    assert [r for r in rewards if r["infra_failure"]] == []
