"""A task made from Harbor's 1.4 template with a separate verifier (``[verifier] environment_mode
= "separate"``, ``tests/Dockerfile`` whose image adds the answer key the test reads), played
through EpisodeRunner and ShellEnv: the oracle scores 1 and doing nothing 0, in default and
strict grading, in bubblewrap (through the ubuntu:24.04 alias) and (marked ``docker``) in
Docker; a verifier image with a RUN step is built by Docker and refused by bubblewrap."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.agents import Agent, NopAgent, OracleAgent
from environments.core import ShellEnv
from environments.runner import EpisodeRunner
from environments.sandboxes import NeedsDockerError
from environments.sandboxes.image_build import ALIASES_VARIABLE
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.dockerfile import BASE_IMAGE
from thundersync.protocol.types import Trajectory

FIXTURE = (
    Path(__file__).resolve().parents[2]
    / "environments/fixtures/terminal_bench/published/separate-verifier"
)


@pytest.fixture(autouse=True)
def ubuntu_alias(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(ALIASES_VARIABLE, f"ubuntu:24.04={BASE_IMAGE}")
    yield


def play(task: TerminalBenchTask, kind: str, agent: Agent, *, strict: bool) -> Trajectory:
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox=kind, strict_grading=strict), agent, lambda event: None
    )
    result = runner.run_episode(task)
    assert not result.infra_failure, result.details
    return result


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_oracle_scores_1_and_nop_0_in_the_verifier_image(kind: str, strict: bool) -> None:
    task = load_tasks(FIXTURE).get("separate-verifier")
    oracle = play(task, kind, OracleAgent(), strict=strict)
    assert oracle.reward == 1.0, oracle.details
    assert oracle.details["separate_verifier"] is True
    assert oracle.details["tamper_suspected"] is False
    nop = play(task, kind, NopAgent(), strict=strict)
    assert nop.reward == 0.0, nop.details


def _with_run_step(tmp_path: Path) -> TerminalBenchTask:
    """The fixture whose verifier image makes its answer key with RUN, outside /tests."""
    task_dir = tmp_path / "separate-verifier"
    shutil.copytree(FIXTURE, task_dir)
    (task_dir / "tests" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY . /tests/\n"
        "RUN mkdir -p /opt/key && cp /tests/answer_key.txt /opt/key/answer.txt\n"
    )
    test = task_dir / "tests" / "test.sh"
    test.write_text(test.read_text().replace("/tests/expected/answer.txt", "/opt/key/answer.txt"))
    return load_tasks(task_dir).get("separate-verifier")


@pytest.mark.docker
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_a_verifier_image_with_a_run_step_is_built_by_docker(tmp_path: Path, strict: bool) -> None:
    task = _with_run_step(tmp_path)
    oracle = play(task, "docker", OracleAgent(), strict=strict)
    assert oracle.reward == 1.0, oracle.details
    assert play(task, "docker", NopAgent(), strict=strict).reward == 0.0


def test_bubblewrap_refuses_a_verifier_image_with_a_run_step(tmp_path: Path) -> None:
    task = _with_run_step(tmp_path)
    assert "verifier image" in (task.needs_docker_reason or "")
    with pytest.raises(NeedsDockerError, match=r"needs Docker: its verifier image .*RUN mkdir"):
        task.sandbox_spec("bwrap")
