"""Harbor multi-step tasks (``[[steps]]``, issue 37 item 1) played through EpisodeRunner and
ShellEnv in real sandboxes: the oracle solves each step with the step's solve.sh and scores 1,
doing nothing scores 0, in bubblewrap and (marked ``docker``) Docker, default and strict; a
fresh separate verifier grades each step; the ``min_reward`` gate stops the episode; an agent
that solves only the first step scores 0.5 with ``mean`` and 0.0 with ``final``; a warm start's
demonstration plays every step."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.agents import Agent, NopAgent, OracleAgent, ScriptedAgent
from environments.core import ShellEnv
from environments.runner import EpisodeRunner
from environments.terminal_bench import TerminalBenchTask, load_tasks
from thundersync.protocol.events import (
    EpisodeStepGraded,
    Event,
    RewardReady,
    ToolFinished,
    TurnCompleted,
)
from thundersync.protocol.types import Trajectory

FIXTURES = Path(__file__).resolve().parents[2] / "environments/fixtures/terminal_bench/multi-step"
GATE, SEPARATE = "two-step-gate", "two-step-separate"


def load(name: str, folder: Path = FIXTURES) -> TerminalBenchTask:
    return load_tasks(folder / name).get(name)


def play(
    task: TerminalBenchTask,
    kind: str,
    agent: Agent,
    *,
    strict: bool = False,
    events: list[Event] | None = None,
) -> Trajectory:
    sink = events.append if events is not None else (lambda event: None)
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox=kind, strict_grading=strict), agent, sink
    )
    result = runner.run_episode(task)
    assert not result.infra_failure, result.details
    return result


def solves_step_1(task: TerminalBenchTask) -> Agent:
    """Plays step 1's reference solution, then submits every step: solves only step 1."""
    return ScriptedAgent([f"```bash\n{c}\n```" for c in task.reference_steps()[0]])


BWRAP = pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
KINDS = [
    pytest.param("bwrap", False, id="bwrap-default", marks=BWRAP),
    pytest.param("docker", False, id="docker-default", marks=pytest.mark.docker),
    pytest.param("docker", True, id="docker-strict", marks=pytest.mark.docker),
]
"""Strict grading in bubblewrap is the same code as in Docker (what differs is the sandbox,
which the default runs exercise): left out to keep the file's time down."""


@pytest.mark.parametrize(("kind", "strict"), KINDS)
def test_oracle_solves_every_step_and_nop_is_stopped_by_the_gate(kind: str, strict: bool) -> None:
    task = load(GATE)
    oracle = play(task, kind, OracleAgent(), strict=strict)
    assert oracle.reward == 1.0, oracle.details
    steps = oracle.details["steps"]
    assert [(s["name"], s["reward"]) for s in steps] == [("01-greet", 1.0), ("02-count", 1.0)]
    assert steps[1]["rewards"] == {"reward": 1.0, "greetings": 1.0, "count": 1.0}
    assert oracle.details["stopped"] is None and oracle.details["tamper_suspected"] is False
    assert oracle.details.get("strict") is strict
    nop = play(task, kind, NopAgent(), strict=strict)
    assert nop.reward == 0.0, nop.details
    assert nop.details["steps_played"] == 1  # the gate after step 1 stopped it


@pytest.mark.parametrize(("kind", "strict"), [KINDS[0], KINDS[2]])
def test_each_step_is_graded_in_a_fresh_separate_verifier(kind: str, strict: bool) -> None:
    task = load(SEPARATE)
    assert [s.verifier is not None for s in task.steps] == [True, True]
    oracle = play(task, kind, OracleAgent(), strict=strict)
    assert oracle.reward == 1.0, oracle.details
    assert oracle.details["separate_verifier"] is True
    assert [s["reward"] for s in oracle.details["steps"]] == [1.0, 1.0]
    nop = play(task, kind, NopAgent(), strict=strict)
    assert nop.reward == 0.0, nop.details
    assert "correctness=0 below min_reward 1" in nop.details["stopped"]


@BWRAP
@pytest.mark.parametrize(("strategy", "reward"), [("mean", 0.5), ("final", 0.0)])
def test_an_agent_that_solves_only_step_1_scores_by_the_strategy(
    tmp_path: Path, strategy: str, reward: float
) -> None:
    folder = tmp_path / "suite"
    shutil.copytree(FIXTURES / GATE, folder / GATE)
    toml = folder / GATE / "task.toml"
    toml.write_text(toml.read_text().replace('strategy = "mean"', f'strategy = "{strategy}"'))
    task = load(GATE, folder)
    assert task.reward_strategy == strategy
    events: list[Event] = []
    result = play(task, "bwrap", solves_step_1(task), events=events)
    assert result.reward == reward, result.details
    assert [s["reward"] for s in result.details["steps"]] == [1.0, 0.0]
    assert result.details["steps_played"] == 2 and result.details["stopped"] is None
    # step 2's instruction was the observation of step 1's submission (a ToolFinished)
    assert len([e for e in events if isinstance(e, ToolFinished)]) == len(result.turns) - 1
    (ready,) = [e for e in events if isinstance(e, RewardReady)]
    assert ready.reward == reward and len(ready.details["steps"]) == 2


@BWRAP
def test_each_step_is_an_event_as_it_is_graded() -> None:
    """Each step's reward was known only from RewardReady's details at the episode's end: an
    EpisodeStepGraded is published as each step is graded, step 1's before step 2's first
    action, the last before RewardReady."""
    task = load(GATE)
    events: list[Event] = []
    result = play(task, "bwrap", solves_step_1(task), events=events)
    graded = [e for e in events if isinstance(e, EpisodeStepGraded)]
    assert [(e.step, e.reward, e.infra_failure) for e in graded] == [
        (0, 1.0, False),
        (1, 0.0, False),
    ]
    assert {e.episode_id for e in graded} == {result.episode_id}
    turns = [i for i, e in enumerate(events) if isinstance(e, TurnCompleted)]
    first, second = (events.index(e) for e in graded)
    steps_1 = len(task.reference_steps()[0]) + 1  # its commands, then the submission
    assert turns[steps_1 - 1] < first < turns[steps_1]  # graded between the steps' turns
    assert second < next(i for i, e in enumerate(events) if isinstance(e, RewardReady))


@BWRAP
@pytest.mark.parametrize("strategy", ["mean", "final"])
def test_never_submitting_step_1_does_not_skip_step_2(tmp_path: Path, strategy: str) -> None:
    """Solving step 1 and then running out of turns instead of submitting ends the episode in
    step 1: step 2, never reached, scores 0 (only a gate excuses a step), so it pays no more
    than submitting and failing step 2 (0.5 by mean, 0 by final)."""
    folder = tmp_path / "suite"
    shutil.copytree(FIXTURES / GATE, folder / GATE)
    toml = folder / GATE / "task.toml"
    toml.write_text(toml.read_text().replace('strategy = "mean"', f'strategy = "{strategy}"'))
    task = load(GATE, folder)
    solve = [f"```bash\n{c}\n```" for c in task.reference_steps()[0]]
    agent = ScriptedAgent([*solve, *["```bash\ntrue\n```"] * 4])
    env = lambda: ShellEnv([task], sandbox="bwrap", max_turns=len(solve) + 2)  # noqa: E731
    result = EpisodeRunner(env, agent, lambda event: None).run_episode(task)
    assert result.stop_reason == "max_turns"
    assert [s["reward"] for s in result.details["steps"]] == [1.0]  # step 1 solved, graded
    assert result.reward == {"mean": 0.5, "final": 0.0}[strategy], result.details


@BWRAP
def test_the_gate_stops_the_episode_before_step_2(tmp_path: Path) -> None:
    """A step 1 below its min_reward ends the episode: step 2 is never shown or graded, and
    the reward is step 1's (the mean over the steps that ran)."""
    task = load(GATE)
    half = ScriptedAgent(["```bash\necho 'Hello, Alice!' > /app/greetings.txt\n```"])
    result = play(task, "bwrap", half)
    assert result.reward == 0.0
    assert result.details["steps_played"] == 1
    assert result.details["stopped"] == "step 01-greet: reward=0 below min_reward 1"
    assert len(result.turns) == 2  # the command and the submission: nothing of step 2
    assert result.stop_reason == "submitted"


@BWRAP
def test_warm_start_demonstrations_play_every_step() -> None:
    """A warm start's demonstration of a multi-step task is the whole episode: each step's
    reference solution, then its submission, the next step's instruction after it."""
    from types import SimpleNamespace

    from environments.agents import SUBMIT_ACTION
    from thundersync.training.demonstrations import _demo

    suite = str(FIXTURES / GATE)
    config = SimpleNamespace(
        env="thundersync/TerminalBench-v0",
        env_kwargs={"suite": suite, "strict_grading": False},
        sandbox="bwrap",
        num_demos=1,
        seed=0,
    )
    demo = _demo(config, 0, 0.0)  # type: ignore[arg-type]
    task = load(GATE)
    instructions = [step.instruction for step in task.steps]
    users = [text for role, text in demo if role == "user"]  # instructions and outputs
    assert [text for text in users if text in instructions] == instructions
    assert [text for role, text in demo if role == "assistant"].count(SUBMIT_ACTION) == 2
    assert demo[-1] == ("assistant", SUBMIT_ACTION)


@BWRAP
def test_strict_grading_holds_per_step_a_hack_in_step_2_scores_0() -> None:
    """Step 1 solved, then a json.py that shadows the module step 2's verifier imports (its
    reward file would say 1): reported in default grading, where the hack is real, and scored
    0 for step 2 under strict grading (strategy ``final``: the episode's 0)."""
    from environments.agents import SUBMIT_ACTION

    task = load(SEPARATE)
    hack = "cat > /app/json.py <<'HACK'\ndef dumps(r):\n    return '{\"reward\": 1.0}'\nHACK"
    solve = [f"```bash\n{c}\n```" for c in task.reference_steps()[0]]
    agent = ScriptedAgent([*solve, SUBMIT_ACTION, f"```bash\n{hack}\n```"])
    lenient = play(task, "bwrap", agent)
    assert lenient.reward == 1.0 and lenient.details["tamper_suspected"] is True
    strict = play(task, "bwrap", agent, strict=True)
    assert strict.reward == 0.0 and strict.details["tamper_suspected"] is True
    first, second = strict.details["steps"]
    assert first["reward"] == 1.0 and first["details"]["tamper_suspected"] is False
    assert second["reward"] == 0.0 and "json.py" in second["details"]["tamper_reasons"][0]
