"""The TRL adapter's contract (reset / the bash tool / get_reward) on ToySum and a plugin env,
and that every sandbox it makes is closed on every way out of an episode (no TRL needed)."""

from __future__ import annotations

import gc
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from environments import load_plugins, register
from environments.sandboxes import make_sandbox
from environments.sandboxes.protocol import SandboxError, SandboxSpec
from environments.tasks import Grade, GradingContext
from thundersync.interop.trl import Outcome, TrlEnvironment, task_rows, trl_environment
from thundersync.protocol.types import StopReason

ROOT = Path(__file__).resolve().parents[3]
PLUGIN_DIR = ROOT / "tests" / "fixtures" / "plugin_env"
TOY = "thundersync/ToySum-v0"


class Tracked:
    """A real bubblewrap sandbox that records whether it was closed."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.inner = make_sandbox(spec, kind="bwrap")
        self.workdir = self.inner.workdir
        self.closed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def close(self) -> None:
        self.closed = True
        self.inner.close()


class Sandboxes:
    """The ``sandbox=`` factory of the envs under test: every sandbox made, and the open ones."""

    def __init__(self) -> None:
        self.made: list[Tracked] = []

    def __call__(self, spec: SandboxSpec) -> Tracked:
        sandbox = Tracked(spec)
        self.made.append(sandbox)
        return sandbox

    def open(self) -> list[Tracked]:
        return [sandbox for sandbox in self.made if not sandbox.closed]


@pytest.fixture
def sandboxes() -> Sandboxes:
    return Sandboxes()


def tools_as_trl_lists_them(cls: type) -> list[str]:
    """The tool names ``GRPOTrainer`` takes from an environment class (grpo_trainer.py)."""
    return [
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


# --- ToySum ----------------------------------------------------------------------------------


def test_reset_draws_the_seeded_task_and_returns_its_instruction(sandboxes):
    reference = gym.make(TOY, sandbox=sandboxes)
    expected, info = reference.reset(seed=11)
    reference.close()
    env = trl_environment(TOY, sandbox=sandboxes)()
    assert env.reset(prompt=[{"role": "user", "content": ""}], seed=11) == expected
    assert "lookup KEY" in expected
    env.bash("lookup red")
    assert env.get_reward() == 0.0
    assert env.outcome.task_id == info["task_id"]


def test_oracle_play_through_the_bash_tool_gets_the_graders_reward(sandboxes):
    env = trl_environment(TOY, sandbox=sandboxes)()
    env.reset(seed=4)
    sandbox = sandboxes.made[-1]  # the task itself comes from an independent env:
    reference = gym.make(TOY, sandbox=sandboxes)
    reference.reset(seed=4)
    solution = reference.unwrapped.task.reference_solution()
    reference.close()
    *lookups, calc, answer = solution
    assert env.bash(lookups[0]).strip().isdigit()
    assert env.bash("lookup nosuchkey").endswith("[exit code 1]")
    assert env.outcome is None  # the episode runs
    env.bash(answer)
    assert sandbox.closed, "the sandbox goes as soon as the episode is graded"
    outcome = env.outcome
    assert outcome.reward == 1.0 and outcome.stop_reason is StopReason.SUBMITTED
    assert outcome.details["answer"] == outcome.details["expected"] == answer.split()[1]
    assert env.get_reward() == 1.0 and env.get_reward() == 1.0  # graded once, read twice
    assert env.bash("ls").startswith("[the episode is over (submitted)")
    assert sandboxes.open() == []


def test_a_rollout_that_stops_early_is_graded_as_it_stands(sandboxes):
    env = trl_environment(TOY, sandbox=sandboxes)()
    env.reset(seed=0)
    env.bash("echo 999 > answer.txt")  # the grader reads answer.txt: a wrong answer
    assert env.outcome is None
    assert env.get_reward() == 0.0
    assert env.outcome.details["answer"] == "999"
    assert env.outcome.stop_reason is StopReason.SUBMITTED
    assert sandboxes.open() == []


def test_the_turn_limit_ends_the_episode_and_says_so(sandboxes):
    env = trl_environment(TOY, sandbox=sandboxes)()
    env.reset(seed=0)
    outputs = [env.bash("true") for _ in range(8)]  # ToySum allows 8 turns
    assert outputs[-1].endswith("[the episode is over: max_turns]")
    assert env.outcome.stop_reason is StopReason.MAX_TURNS and env.get_reward() == 0.0
    assert sandboxes.open() == []


def test_each_instance_is_one_sandbox_and_every_way_out_closes_it(sandboxes):
    cls = trl_environment(TOY, sandbox=sandboxes)
    env = cls()
    assert sandboxes.made == []  # TRL probes one instance at start: it costs no sandbox
    env.reset(seed=1)
    first = sandboxes.open()
    assert len(first) == 1
    env.reset(seed=2)  # a pooled instance reused for the next rollout
    assert first[0].closed and len(sandboxes.open()) == 1
    env.bash("lookup red")
    del env
    gc.collect()
    assert sandboxes.open() == []  # dropped mid-episode
    with cls() as env:
        env.reset(seed=3)
        assert len(sandboxes.open()) == 1
    assert sandboxes.open() == []


def test_task_rows_give_a_group_one_task_and_rows_different_ones(sandboxes):
    rows = task_rows(2, seed=7)
    assert [row["seed"] for row in rows] == [7, 8]
    assert rows[0]["prompt"] == [{"role": "user", "content": ""}]
    cls = trl_environment(TOY, sandbox=sandboxes)
    a, b, c = cls(), cls(), cls()
    assert a.reset(**rows[0]) == b.reset(**rows[0]) != c.reset(**rows[1])
    for env in (a, b, c):
        env.get_reward()
    assert a.outcome.task_id == b.outcome.task_id != c.outcome.task_id
    assert sandboxes.open() == []


def test_the_class_has_exactly_one_tool_with_a_schema_trl_can_render():
    from transformers.utils import get_json_schema

    cls = trl_environment(TOY, tools="python")
    assert cls.__name__ == "ToySum_v0"  # TRL logs the reward under it
    assert tools_as_trl_lists_them(cls) == ["bash"]
    schema = get_json_schema(cls().bash)["function"]
    assert schema["name"] == "bash"
    assert schema["parameters"]["properties"]["command"]["type"] == "string"
    assert schema["parameters"]["required"] == ["command"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"seed": -1}, "row column 'seed': expected an integer >= 0, got -1"),
        ({"seed": "3"}, "row column 'seed': expected an integer >= 0, got '3'"),
        ({"seed": True}, "row column 'seed': expected an integer >= 0, got True"),
    ],
)
def test_a_bad_seed_column_is_a_one_line_error(row, message):
    env = trl_environment(TOY, tools="python")()
    with pytest.raises(ValueError, match=f"env {TOY}: {message}"):
        env.reset(**row)


def test_misuse_is_refused_with_errors_naming_it():
    with pytest.raises(ValueError, match="env_id 'thundersync/NoSuch-v0': not a registered env"):
        trl_environment("thundersync/NoSuch-v0")
    env = trl_environment(TOY, tools="python")()
    with pytest.raises(RuntimeError, match="bash\\(\\) before reset\\(\\)"):
        env.bash("ls")
    with pytest.raises(RuntimeError, match="get_reward\\(\\) before reset\\(\\)"):
        env.get_reward()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="must not contain ```"):
        env.bash("echo ```")
    with pytest.raises(ValueError, match="non-empty string, got '  '"):
        env.bash("  ")
    with pytest.raises(ValueError, match="num_rows: expected an integer >= 1, got 0"):
        task_rows(0)


# --- the grader, strict or not, and infrastructure failures -----------------------------------


@dataclass(frozen=True, slots=True)
class ProbeTask:
    """Its reward says whether grading was strict; ``broken`` makes its grader's sandbox fail."""

    broken: bool = False
    task_id: str = "probe"
    instruction: str = "Do anything."
    max_turns: int = 2
    timeout_s: float = 5.0

    def sandbox_spec(self, kind: str | None) -> SandboxSpec:
        return SandboxSpec(memory_mb=256, pids=64)

    def setup(self, sandbox: Any) -> None:
        return None

    def grade(self, sandbox: Any, context: GradingContext) -> Grade:
        if self.broken:
            raise SandboxError("the grader's sandbox vanished")
        return Grade(0.25 if context.strict else 0.75)

    def reference_solution(self) -> list[str]:
        return []


def test_rewards_come_from_the_grader_strict_unless_asked_otherwise(sandboxes):
    register("thundersync/TrlProbe-v0", "environments.core:ShellEnv", tasks=[ProbeTask()])
    strict = trl_environment("thundersync/TrlProbe-v0", sandbox=sandboxes)()
    strict.reset()
    assert strict.get_reward() == 0.25
    lenient = trl_environment("thundersync/TrlProbe-v0", strict_grading=False, sandbox=sandboxes)()
    lenient.reset(task="probe")  # a row's task column picks the task by id
    assert lenient.get_reward() == 0.75
    with pytest.raises(ValueError, match="options\\['task'\\]: unknown task id 'nope'"):
        lenient.reset(task="nope")
    assert sandboxes.open() == []


def test_an_infrastructure_failure_is_no_reward_at_all(sandboxes):
    register("thundersync/TrlBroken-v0", "environments.core:ShellEnv", tasks=[ProbeTask(True)])
    env = trl_environment("thundersync/TrlBroken-v0", sandbox=sandboxes)()
    env.reset()
    assert env.get_reward() is None  # TRL 1.16: unscorable, advantage 0, not trained on
    assert env.outcome.infra_failure and "vanished" in env.outcome.details["error"]

    def no_sandbox(spec: SandboxSpec) -> Any:
        raise SandboxError("no bubblewrap today")

    env = trl_environment(TOY, sandbox=no_sandbox)()
    assert env.reset(seed=0).startswith("Infrastructure failure: SandboxError: no bubblewrap")
    assert env.get_reward() is None
    assert env.outcome == Outcome(
        task_id=env.outcome.task_id,
        reward=None,
        stop_reason=StopReason.ERROR,
        infra_failure=True,
        details={"error": "SandboxError: no bubblewrap today"},
    )
    assert sandboxes.open() == []


def test_a_tool_that_raises_leaves_no_sandbox(sandboxes):
    class Exploding(Tracked):
        def execute(self, cmd: str, timeout: float) -> Any:
            if cmd == "boom":
                raise RuntimeError("the sandbox library broke")
            return self.inner.execute(cmd, timeout)

    made: list[Exploding] = []

    def factory(spec: SandboxSpec) -> Exploding:
        made.append(Exploding(spec))
        return made[-1]

    env = trl_environment(TOY, sandbox=factory)()
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="library broke"):  # TRL shows it as the tool's error
        env.bash("boom")
    assert made and all(sandbox.closed for sandbox in made)


# --- a plugin env, with no code of its own -------------------------------------------------------


def test_a_third_party_plugin_env_works_through_the_adapter(monkeypatch, sandboxes):
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    load_plugins(reload=True)
    cls = trl_environment("demoplugin/Greet-v0", sandbox=sandboxes)
    assert issubclass(cls, TrlEnvironment) and tools_as_trl_lists_them(cls) == ["bash"]
    env = cls()
    assert env.reset(prompt=[]) == "Write hello to greeting.txt, then submit."
    assert env.bash("echo hello > greeting.txt") == ""
    assert env.bash("cat greeting.txt") == "hello\n"
    env.bash("submit")
    assert env.outcome.stop_reason is StopReason.SUBMITTED and env.get_reward() == 1.0
    env.reset()
    env.bash("echo goodbye > greeting.txt")
    assert env.get_reward() == 0.0
    assert len(sandboxes.made) == 2 and sandboxes.open() == []
