"""A multi-container Harbor task (environment/docker-compose.yaml: ``main`` and a ``kv`` sidecar
the agent reaches by name, written from harbor 0.26's models) in Docker: the oracle scores 1 and
doing nothing 0, default and strict; a sidecar that exits, or never turns healthy, is the
task's infrastructure failure with its last log lines, within its bound; Ctrl-C of a real
``eval`` mid-episode leaves no container, network or volume; a task that declares ``public``
runs with no route out (its containers have a loopback interface only, the sidecar the task's
limits), and its failure says why."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.agents import Agent, NopAgent, OracleAgent
from environments.core import ShellEnv
from environments.runner import EpisodeRunner
from environments.sandboxes import make_sandbox
from environments.sandboxes.image_build import ALIASES_VARIABLE, LABEL
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.dockerfile import BASE_IMAGE
from thundersync.protocol.types import Trajectory

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "environments/fixtures/terminal_bench/published/compose-sidecar"
ALIAS = f"ubuntu:24.04={BASE_IMAGE}"


@pytest.fixture(autouse=True)
def ubuntu_alias(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(ALIASES_VARIABLE, ALIAS)
    yield


def play(task: TerminalBenchTask, agent: Agent, *, strict: bool = False) -> Trajectory:
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox="docker", strict_grading=strict), agent, lambda e: None
    )
    return runner.run_episode(task)


def variant(tmp_path: Path, *, compose: str | None = None, toml: str = "") -> Path:
    """A copy of the fixture with its compose file's kv service replaced and task.toml added to."""
    task_dir = tmp_path / "suite" / "compose-sidecar"
    shutil.copytree(FIXTURE, task_dir)
    if compose is not None:
        (task_dir / "environment" / "docker-compose.yaml").write_text(compose)
    path = task_dir / "task.toml"
    path.write_text(path.read_text().replace('network_mode = "no-network"\n', toml))
    return task_dir


def labelled(kind: str, pid: int) -> list[str]:
    """Names of Docker objects of ``kind`` that process ``pid`` made and left."""
    found = subprocess.run(
        ["docker", kind, "ls", "-q", *(["-a"] if kind == "container" else [])]
        + ["--filter", f"label={LABEL}.owner_pid={pid}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.split()


@pytest.mark.slow
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_oracle_scores_1_and_nop_0_with_the_sidecar(strict: bool) -> None:
    task = load_tasks(FIXTURE).get("compose-sidecar")
    oracle = play(task, OracleAgent(), strict=strict)
    assert (oracle.reward, oracle.infra_failure) == (1.0, False), oracle.details
    assert oracle.details["tamper_suspected"] is False
    nop = play(task, NopAgent(), strict=strict)
    assert (nop.reward, nop.infra_failure) == (0.0, False), nop.details
    assert "network" not in nop.details  # no-network declared: nothing to say
    for kind in ("container", "volume"):
        assert labelled(kind, os.getpid()) == []


BROKEN_KV = """services:
  main:
    depends_on: [kv]
  kv:
    build: ./kv
    command: ["sh", "-c", "echo kv cannot start: boom-4711; exit 3"]
    healthcheck:
      test: ["CMD", "true"]
"""


def test_a_sidecar_that_exits_is_an_infrastructure_failure_with_its_log_lines(
    tmp_path: Path,
) -> None:
    task = load_tasks(variant(tmp_path, compose=BROKEN_KV)).get("compose-sidecar")
    result = play(task, OracleAgent())
    assert result.infra_failure, result.details
    error = str(result.details)
    assert "service kv failed to start" in error and "boom-4711" in error
    for kind in ("container", "volume"):
        assert labelled(kind, os.getpid()) == []


NEVER_HEALTHY = """services:
  kv:
    build: {context: ./kv}
    environment: {KV_SECRET: x}
    healthcheck:
      test: ["CMD-SHELL", "echo not yet: still-booting-99; exit 1"]
      interval: 1s
      timeout: 1s
      retries: 1
"""


def test_a_sidecar_never_healthy_fails_within_its_bound(tmp_path: Path) -> None:
    task = load_tasks(variant(tmp_path, compose=NEVER_HEALTHY)).get("compose-sidecar")
    result = play(task, OracleAgent())
    assert result.infra_failure, result.details
    error = str(result.details)
    assert "not ready after 2 s" in error and "still-booting-99" in error


@pytest.mark.slow
def test_a_public_task_runs_with_no_route_out_and_its_failure_says_why(tmp_path: Path) -> None:
    toml = 'network_mode = "public"\n'
    task = load_tasks(variant(tmp_path, toml=toml)).get("compose-sidecar")
    sandbox = make_sandbox(task.sandbox_spec("docker"), kind="docker")
    try:
        interfaces = "ls /sys/class/net; awk 'NR > 1' /proc/net/route"  # and no route at all
        main = sandbox.execute(interfaces, timeout=30)
        kv = subprocess.run(
            ["docker", "exec", f"{sandbox.marker}-kv", "sh", "-c", interfaces],  # type: ignore[attr-defined]
            capture_output=True,
            text=True,
            check=True,
        )
        limits = subprocess.run(
            ["docker", "inspect", "--format", "{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}}"]
            + [f"{sandbox.marker}-kv"],  # type: ignore[attr-defined]
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        sandbox.close()
    assert main.output.split() == ["lo"] and kv.stdout.split() == ["lo"]
    assert limits.stdout.split() == [str(512 * 2**20), str(10**9)]  # the task's memory_mb, cpus
    nop = play(task, NopAgent())
    assert (nop.reward, nop.infra_failure) == (0.0, False)
    assert nop.details["network"]["granted"] == "no-network"
    assert "environment.network_mode = 'public'" in nop.details["reason"]
    assert nop.details["network"]["declared"]["environment"] == {
        "network_mode": "public",
        "allowed_hosts": [],
    }


@pytest.mark.slow
def test_ctrl_c_of_eval_mid_episode_leaves_no_container_network_or_volume(
    tmp_path: Path,
) -> None:
    task_dir = variant(tmp_path)
    (task_dir / "solution" / "solve.sh").write_text("#!/bin/bash\ntrap '' TERM INT HUP\nsleep 60\n")
    argv = [sys.executable, "-m", "thundersync.cli", "eval", "--suite", str(task_dir.parent)]
    argv += ["--agent", "oracle", "--sandbox", "docker", "--out", str(tmp_path / "out")]
    argv += ["--json", "--no-leaderboard"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), ALIASES_VARIABLE: ALIAS}
    since = int(time.time()) - 1
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        import docker

        client = docker.from_env()
        events = client.events(
            decode=True,
            since=since,
            until=since + 300,
            filters={"type": "container", "label": f"{LABEL}.owner_pid={proc.pid}"},
        )
        # the agent's first command (the oracle's) starting in main: the episode is under way
        started = next(
            (
                e
                for e in events
                if "exec_start" in e["Action"] and "thundersync-exec" in e["Action"]
            ),
            None,
        )
        assert started is not None, proc.stderr.read() if proc.poll() is not None else "no exec"
        assert len(labelled("container", proc.pid)) == 3  # main, kv and the network's holder
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, stderr
    for kind in ("container", "volume"):
        assert labelled(kind, proc.pid) == [], kind
