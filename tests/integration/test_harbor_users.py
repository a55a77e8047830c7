"""Harbor's ``user`` fields (schema 1.4; issue 37), a fixture written from harbor 0.26's
TaskConfig: in Docker the agent's commands run as ``[agent] user``, the test script as
``[verifier] user`` and a collect hook as its own ``user`` (they were read and ignored: every
command ran as the image's user, so a task that needs an unprivileged agent was graded on a
root one); the oracle scores 1 and doing nothing 0, default and strict. Bubblewrap, which runs
every command as one user, refuses such a task before the episode, naming the field's user; a
step's user falls back to the task's, and a malformed one is refused naming its field."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.agents import Agent, NopAgent, OracleAgent
from environments.core import ShellEnv
from environments.runner import EpisodeRunner
from environments.sandboxes import NeedsDockerError
from environments.sandboxes.image_build import ALIASES_VARIABLE
from environments.tasks import TaskFormatError
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.dockerfile import BASE_IMAGE
from thundersync.protocol.types import Trajectory

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = ROOT / "harbor-1.4-extras" / "runs-as-users"
MULTI_STEP = ROOT / "harbor-1.4" / "ms-two-step-mean"


@pytest.fixture(autouse=True)
def ubuntu_alias(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(ALIASES_VARIABLE, f"ubuntu:24.04={BASE_IMAGE}")
    yield


def play(
    task: TerminalBenchTask, agent: Agent, *, strict: bool, out: Path | None = None
) -> Trajectory:
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox="docker", strict_grading=strict, artifacts_dir=out),
        agent,
        lambda event: None,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a collect hook that fails (as the wrong user) warns
        return runner.run_episode(task)


@pytest.mark.docker
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_the_agent_verifier_and_hook_run_as_their_users(tmp_path: Path, strict: bool) -> None:
    task = load_tasks(FIXTURE).get("runs-as-users")
    oracle = play(task, OracleAgent(), strict=strict, out=tmp_path)
    assert (oracle.reward, oracle.infra_failure) == (1.0, False), oracle.details
    (episode,) = tmp_path.iterdir()
    assert (episode / "logs" / "artifacts" / "hook-user.txt").read_text() == "agent\n"
    nop = play(task, NopAgent(), strict=strict)
    assert (nop.reward, nop.infra_failure) == (0.0, False), nop.details


@pytest.mark.docker
def test_the_agent_cannot_do_what_its_user_may_not(tmp_path: Path) -> None:
    """An agent told to write where only root may gets no further than its user: the command
    fails in the sandbox, as it would under Harbor."""
    from environments.sandboxes import make_sandbox
    from environments.terminal_bench import users

    task = load_tasks(FIXTURE).get("runs-as-users")
    sandbox = make_sandbox(task.sandbox_spec("docker"), "docker")
    try:
        task.setup(sandbox)
        result = sandbox.execute("id -un; touch /etc/planted", timeout=30)
        assert result.output.startswith("agent\n") and result.exit_code != 0, result
        with users.running_as(sandbox, "root"):
            assert sandbox.execute("id -un", timeout=30).output == "root\n"
        assert sandbox.execute("id -un", timeout=30).output == "agent\n"
    finally:
        sandbox.close()


@pytest.mark.docker
def test_a_steps_healthcheck_runs_as_its_agent_user(tmp_path: Path) -> None:
    """Harbor runs a step's [steps.healthcheck] as the step's agent user, as its setup.sh (the
    healthcheck ran as the image's user, and failed the task)."""
    folder = tmp_path / "runs-as-users"
    shutil.copytree(FIXTURE, folder)
    step = folder / "steps" / "only"
    step.mkdir(parents=True)
    shutil.move(folder / "instruction.md", step / "instruction.md")
    with (folder / "task.toml").open("a") as toml:
        toml.write('\n[[steps]]\nname = "only"\n\n[steps.healthcheck]\n')
        toml.write("command = 'test \"$(id -un)\" = agent'\nretries = 1\n")
    task = load_tasks(folder).get("runs-as-users")
    result = play(task, OracleAgent(), strict=False, out=tmp_path / "out")
    assert (result.reward, result.infra_failure) == (1.0, False), result.details


def test_bubblewrap_refuses_a_task_that_names_a_user() -> None:
    task = load_tasks(FIXTURE).get("runs-as-users")
    with pytest.raises(
        NeedsDockerError, match="runs commands as a user it names \\(agent, root\\)"
    ):
        task.sandbox_spec("bwrap")


def _copy(tmp_path: Path, source: Path, old: str, new: str) -> Path:
    task_dir = tmp_path / source.name
    shutil.copytree(source, task_dir)
    path = task_dir / "task.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return task_dir


def test_a_steps_user_is_its_own_else_the_tasks(tmp_path: Path) -> None:
    folder = _copy(tmp_path, MULTI_STEP, "[agent]\n", "[agent]\nuser = 1000\n")
    text = (folder / "task.toml").read_text()
    second = 'name = "02-count"\n\n[steps.agent]\n'
    assert second in text
    (folder / "task.toml").write_text(text.replace(second, second + 'user = "builder"\n'))
    task = load_tasks(folder).get(MULTI_STEP.name)
    assert [task.step_task(i).agent_user for i in range(2)] == ["1000", "builder"]
    assert task.step_task(0).verifier_user is None


@pytest.mark.parametrize("value", ['"a b"', '""', "-1", "true", '"x;rm"'])
def test_a_malformed_user_is_refused_naming_its_field(tmp_path: Path, value: str) -> None:
    folder = _copy(tmp_path, FIXTURE, 'user = "root"', f"user = {value}")
    with pytest.raises(TaskFormatError, match=r"verifier\.user"):
        load_tasks(folder).get("runs-as-users")
