"""EpisodeRunner: event order and timing, token ids, infra failures, groups, concurrency."""

from __future__ import annotations

import os
import signal
import threading
import time

from environments.actions import format_action
from environments.agents import Action, NopAgent, OracleAgent, ScriptedAgent
from environments.core import ShellEnv
from environments.episode_steps import drive
from environments.runner import EpisodeRunner
from environments.sandboxes.protocol import SandboxError
from environments.toy import ToySumEnv
from tests.unit.environments.shell_fakes import FileTask, LocalSandbox, SandboxMaker
from thundersync.protocol.events import (
    EpisodeStarted,
    RewardReady,
    ToolFinished,
    TurnCompleted,
)


def words(text: str) -> tuple[int, ...]:
    return tuple(len(word) for word in text.split())


def names(events) -> list[str]:
    return [type(event).__name__ for event in events]


def run_one(agent, task=None, maker=None, **env_kwargs):
    task = task or FileTask()
    maker = maker or SandboxMaker()
    events = []
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox=maker, **env_kwargs), agent, events.append
    )
    result = runner.run_episode(task)
    return result, events, maker, task


def test_event_order_and_timestamps_tool_and_grading_start_after_their_events():
    agent = ScriptedAgent([format_action("echo ok > answer.txt"), format_action("ls")])
    result, events, maker, task = run_one(agent)
    assert names(events) == [
        "EpisodeStarted",
        "TurnCompleted",
        "ToolFinished",
        "TurnCompleted",
        "ToolFinished",
        "TurnCompleted",
        "EpisodeCompleted",
        "RewardReady",
    ]
    assert [e.turn for e in events if isinstance(e, TurnCompleted)] == [0, 1, 2]
    sandbox = maker.made[0]
    tool_starts = sandbox.exec_started[1:3]  # call 0 is the task's setup
    turns = [e for e in events if isinstance(e, TurnCompleted)]
    finished = [e for e in events if isinstance(e, ToolFinished)]
    for turn, tool_start, tool_end in zip(turns, tool_starts, finished, strict=False):
        assert turn.t < tool_start < tool_end.t
    completed = events[-2]
    assert completed.t < task.grade_started[0] < events[-1].t
    assert completed.num_turns == 3 and completed.stop_reason == "submitted"
    assert events[-1].reward == 1.0 and not events[-1].infra_failure
    assert result.reward == 1.0 and maker.num_open == 0
    assert len({e.episode_id for e in events}) == 1


def test_token_ids_flow_into_events_and_the_trajectory():
    agent = ScriptedAgent([format_action("echo a b c")], tokenize=words, policy_version=7)
    result, events, _, _ = run_one(agent)
    started = events[0]
    assert isinstance(started, EpisodeStarted)
    assert started.prompt_ids == words("Write ok to answer.txt.") and started.policy_version == 7
    first_turn = events[1]
    assert first_turn.action_ids == words(format_action("echo a b c"))
    assert first_turn.action_logprobs == (0.0,) * len(first_turn.action_ids)
    assert events[2].observation_ids == words("a b c\n")
    trajectory = result
    assert trajectory.prompt_ids == started.prompt_ids
    assert [t.observation_ids for t in trajectory.turns] == [words("a b c\n"), ()]
    assert trajectory.turns[0].policy_version == 7


def test_a_submitting_command_gets_its_tool_finished():
    agent = ScriptedAgent([format_action("echo ok > answer.txt; echo THUNDERSYNC_SUBMIT")])
    result, events, _, _ = run_one(agent)
    assert names(events) == [
        "EpisodeStarted",
        "TurnCompleted",
        "ToolFinished",
        "EpisodeCompleted",
        "RewardReady",
    ]
    assert result.reward == 1.0


def test_unparseable_actions_get_tool_finished_except_the_last():
    agent = ScriptedAgent(["no block", "still none"], tokenize=words)
    result, events, _, _ = run_one(agent, max_format_errors=2)
    assert names(events) == [
        "EpisodeStarted",
        "TurnCompleted",
        "ToolFinished",
        "TurnCompleted",
        "EpisodeCompleted",
        "RewardReady",
    ]
    assert events[2].exit_code is None and events[2].observation_ids
    assert result.stop_reason == "format_errors" and result.reward == 0.0


def test_max_turns_truncation_is_reported():
    agent = ScriptedAgent([format_action("true")] * 10)
    result, events, _, _ = run_one(agent, max_turns=3)
    assert result.stop_reason == "max_turns" and events[-2].num_turns == 3


def test_a_crashing_sandbox_becomes_an_infra_failure_not_a_crash():
    agent = ScriptedAgent([format_action("echo hi"), format_action("echo again")])
    result, events, maker, _ = run_one(agent, maker=SandboxMaker(fail_on_call=3))
    assert names(events)[-2:] == ["EpisodeCompleted", "RewardReady"]
    assert events[-2].stop_reason == "error"
    assert events[-1].infra_failure and "fake sandbox died" in events[-1].details["error"]
    assert result.infra_failure and maker.num_open == 0


def test_a_sandbox_that_never_starts_still_yields_the_event_skeleton():
    result, events, _, _ = run_one(OracleAgent(), maker=SandboxMaker(fail_on_create=True))
    assert names(events) == ["EpisodeStarted", "EpisodeCompleted", "RewardReady"]
    assert result.infra_failure and result.stop_reason == "error"


class ExplodingAgent:
    policy_version = 0

    def act(self, task, messages, *, episode_id):
        raise RuntimeError("agent blew up")

    def encode_prompt(self, text):
        return ()

    def encode_observation(self, text):
        return ()


def test_an_agent_exception_is_recorded_and_the_sandbox_closed():
    result, events, maker, _ = run_one(ExplodingAgent())
    assert names(events) == ["EpisodeStarted", "EpisodeCompleted", "RewardReady"]
    assert "agent blew up" in events[-1].details["error"] and events[-1].infra_failure
    assert maker.num_open == 0 and result.reward == 0.0


class CountingMaker(SandboxMaker):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()
        self.peak = 0

    def __call__(self, spec):
        sandbox = super().__call__(spec)
        with self.lock:
            self.peak = max(self.peak, self.num_open)
        return sandbox


def test_groups_run_concurrently_with_bounded_concurrency_and_unique_ids():
    tasks = [FileTask(task_id=f"t{i}", expected=f"v{i}") for i in range(3)]
    maker = CountingMaker()
    events = []
    runner = EpisodeRunner(
        lambda: ShellEnv(tasks, sandbox=maker), OracleAgent(), events.append, max_concurrency=2
    )
    groups = runner.run_groups(tasks, group_size=2, seed=0)
    assert [[r.task_id for r in group] for group in groups] == [
        ["t0", "t0"],
        ["t1", "t1"],
        ["t2", "t2"],
    ]
    assert all(r.reward == 1.0 for group in groups for r in group)
    episode_ids = [r.episode_id for group in groups for r in group]
    assert len(set(episode_ids)) == 6 and all(isinstance(i, str) for i in episode_ids)
    group_ids = [{r.group_id for r in group} for group in groups]
    assert all(len(ids) == 1 for ids in group_ids) and len(set().union(*group_ids)) == 3
    starts = [e for e in events if isinstance(e, EpisodeStarted)]
    assert all(e.group_size == 2 for e in starts)
    assert 1 <= maker.peak <= 2 and maker.num_open == 0
    assert sum(isinstance(e, RewardReady) for e in events) == 6


def test_a_drawn_group_plays_one_task_in_every_episode():
    maker = SandboxMaker()
    runner = EpisodeRunner(lambda: ToySumEnv(sandbox=maker), NopAgent(), lambda e: None)
    group = runner.run_group(None, 3, seed=5)
    assert len({r.task_id for r in group}) == 1
    assert all(r.reward == 0.0 and not r.infra_failure for r in group)
    assert maker.num_open == 0


def test_a_failing_tool_call_still_counts_its_published_turn():
    """The sandbox dies during turn 1's tool call (call 0 is setup, 1 is turn 0): the episode
    has 2 published actions, so EpisodeCompleted must say 2 turns."""
    from environments.runner import EpisodeRunner as Runner
    from thundersync.protocol.events import EpisodeCompleted

    agent = ScriptedAgent([format_action("ls"), format_action("ls")], tokenize=words)
    events = []
    maker = SandboxMaker(fail_on_call=3)
    runner = Runner(lambda: ShellEnv([FileTask()], sandbox=maker), agent, events.append)
    result = runner.run_episode()
    published = [e for e in events if isinstance(e, TurnCompleted)]
    completed = next(e for e in events if isinstance(e, EpisodeCompleted))
    assert len(published) == completed.num_turns == len(result.turns) == 2
    assert result.infra_failure and maker.num_open == 0


def test_a_failing_sink_propagates_and_never_contradicts_a_published_reward():
    import pytest

    from environments.runner import SinkError

    seen = []

    def sink(event):
        seen.append(event)
        if isinstance(event, RewardReady):
            raise OSError("disk full")

    maker = SandboxMaker()
    runner = EpisodeRunner(lambda: ShellEnv([FileTask()], sandbox=maker), NopAgent(), sink)
    with pytest.raises(SinkError, match="RewardReady: disk full"):
        runner.run_episode()
    assert sum(isinstance(e, RewardReady) for e in seen) == 1
    assert maker.num_open == 0


def test_a_stopping_run_starts_no_more_episodes_and_removes_every_sandbox():
    import pytest

    from environments.runner import SinkError

    started = []

    def sink(event):
        if isinstance(event, EpisodeStarted):
            started.append(event)
            if len(started) == 2:
                raise OSError("consumer crashed")

    maker = SandboxMaker()
    agent = ScriptedAgent([format_action("sleep 0.2")] * 3)
    runner = EpisodeRunner(
        lambda: ShellEnv([FileTask()], sandbox=maker), agent, sink, max_concurrency=2
    )
    with pytest.raises(SinkError):
        runner.run_groups([FileTask()] * 4, group_size=2)
    assert len(started) < 8
    assert maker.num_open == 0


class FullContextAgent:
    """Acts once, then finds its context window full."""

    policy_version = 0

    def act(self, task, messages, *, episode_id):
        from environments.agents import Action, ContextExhausted

        if len(messages) > 1:
            raise ContextExhausted("no room left")
        return Action(format_action("echo ok > answer.txt"), (1, 2), (-0.5, -0.5))

    def encode_prompt(self, text):
        return (7,)

    def encode_observation(self, text):
        return (8,)


def test_a_full_context_truncates_the_episode_and_still_grades_it():
    result, events, maker, task = run_one(FullContextAgent())
    assert names(events) == [
        "EpisodeStarted",
        "TurnCompleted",
        "ToolFinished",
        "EpisodeCompleted",
        "RewardReady",
    ]
    assert events[-2].stop_reason == "length" and events[-2].num_turns == 1
    assert result.reward == 1.0 and not result.infra_failure and result.stop_reason == "length"
    assert len(task.grade_started) == 1 and maker.num_open == 0


# --- cancellation --------------------------------------------------------------------------


class BlockingSandbox(LocalSandbox):
    """A fake whose commands containing ``block`` run until ``close()`` (from any thread)
    interrupts them, as the real sandboxes' close does; others run normally."""

    def __init__(self, spec, **kwargs):
        super().__init__(spec, **kwargs)
        self.released = threading.Event()
        self.running = threading.Event()

    def execute(self, cmd, timeout):
        if "block" not in cmd:
            return super().execute(cmd, timeout)
        self.running.set()
        if not self.released.wait(timeout=30):
            raise AssertionError("nobody closed the sandbox")
        raise SandboxError("closed while its command ran")

    def close(self):
        self.released.set()
        super().close()


class BlockingMaker(SandboxMaker):
    def __call__(self, spec):
        sandbox = BlockingSandbox(spec)
        self.made.append(sandbox)
        return sandbox

    def wait_running(self, count):
        deadline = time.monotonic() + 10
        while sum(s.running.is_set() for s in self.made) < count:
            assert time.monotonic() < deadline, "the blocking commands never started"
            time.sleep(0.01)


def test_cancel_from_another_thread_ends_a_running_command_at_once():
    maker = BlockingMaker()
    events = []
    runner = EpisodeRunner(
        lambda: ShellEnv([FileTask()], sandbox=maker),
        ScriptedAgent([format_action("block")]),
        events.append,
    )
    result = []
    worker = threading.Thread(target=lambda: result.append(runner.run_episode()))
    worker.start()
    maker.wait_running(1)
    runner.cancel("test says stop")
    worker.join(timeout=5)
    assert not worker.is_alive(), "run_episode kept waiting for the command"
    (trajectory,) = result
    assert trajectory.infra_failure and trajectory.reward == 0.0
    assert trajectory.details["cancelled"] == "test says stop"
    assert trajectory.details["error"].startswith("RunCancelled: test says stop")
    assert names(events)[-2:] == ["EpisodeCompleted", "RewardReady"]
    assert maker.num_open == 0 and runner.cancelled == "test says stop"


def test_a_cancelled_run_returns_every_group_and_keeps_finished_rewards():
    tasks = [FileTask(task_id="quick"), FileTask(task_id="stuck")]

    class Agent(OracleAgent):
        def act(self, task, messages, *, episode_id=""):
            if task.task_id == "stuck" and len(messages) == 1:
                return Action(format_action("block"))
            return super().act(task, messages, episode_id=episode_id)

    maker = BlockingMaker()
    events = []
    runner = EpisodeRunner(
        lambda: ShellEnv(tasks, sandbox=maker), Agent(), events.append, max_concurrency=2
    )
    # Both stuck episodes blocking means both quick ones have ended (two slots, queued in
    # order); after only one, the second quick episode could still be grading when cancelled.
    threading.Timer(0.0, lambda: (maker.wait_running(2), runner.cancel("SIGINT"))).start()
    quick, stuck = runner.run_groups(tasks, group_size=2)
    assert [r.reward for r in quick] == [1.0, 1.0] and not any(r.infra_failure for r in quick)
    assert all(r.infra_failure and r.details["cancelled"] == "SIGINT" for r in stuck)
    assert sum(isinstance(e, RewardReady) for e in events) == 4 and maker.num_open == 0
    made = len(maker.made)
    later = runner.run_episode(tasks[0])
    assert later.infra_failure and later.details["cancelled"] == "SIGINT"
    assert len(maker.made) == made, "a cancelled runner made another sandbox"


class UnremovableSandbox(LocalSandbox):
    def close(self):
        super().close()
        raise SandboxError("could not remove container x: the daemon is gone")


class UnremovableMaker(SandboxMaker):
    def __call__(self, spec):
        self.made.append(UnremovableSandbox(spec))
        return self.made[-1]


def test_an_env_whose_sandbox_cannot_be_removed_is_an_infra_failure_not_a_crash():
    events = []
    make_env = lambda: ShellEnv([FileTask()], sandbox=UnremovableMaker())  # noqa: E731
    result = EpisodeRunner(make_env, OracleAgent(), events.append).run_episode()
    assert result.infra_failure and "the daemon is gone" in result.details["error"]
    assert events[-1].infra_failure and names(events).count("RewardReady") == 1


def test_cancel_on_signals_turns_sigint_into_a_cancel_and_restores_the_handler():
    runner = EpisodeRunner(
        lambda: ShellEnv([FileTask()], sandbox=SandboxMaker()), NopAgent(), lambda e: None
    )
    before = signal.getsignal(signal.SIGINT)
    with runner.cancel_on_signals() as received:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while runner.cancelled is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert received == [signal.SIGINT] and runner.cancelled == "SIGINT"
    assert signal.getsignal(signal.SIGINT) is before


def test_an_episode_generator_closed_early_closes_its_env_and_publishes_no_reward():
    # Drivers that advance episodes themselves (thundersync.training.episodes) may abandon one:
    # its sandbox must still be removed.
    maker = SandboxMaker()
    events = []
    task = FileTask()
    runner = EpisodeRunner(lambda: ShellEnv([task], sandbox=maker), NopAgent(), events.append)
    steps = runner.episode(task, episode_id="e0")
    need = next(steps)
    assert need.episode_id == "e0" and need.messages[0].role == "user"
    assert maker.num_open == 1
    steps.close()
    assert maker.num_open == 0
    assert "RewardReady" not in names(events)


def test_an_episode_prepared_ahead_publishes_nothing_until_it_plays_and_its_clock_starts_then(
    monkeypatch,
):
    """``prepare`` makes and resets the env now (its sandbox made, the task set up) and
    publishes nothing; the episode then plays in that env with the events an unprepared one
    has, and ``max_episode_s`` counts from when it plays, not from when it was prepared."""
    clock = [1000.0]
    monkeypatch.setattr("environments.core.time.monotonic", lambda: clock[0])
    actions = [format_action("echo ok > answer.txt"), format_action("submit")]
    reference, _, _, _ = run_one(ScriptedAgent(actions), max_episode_s=10.0)
    task, maker, events = FileTask(), SandboxMaker(), []
    agent = ScriptedAgent(actions)
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox=maker, max_episode_s=10.0), agent, events.append
    )
    prepared = runner.prepare(task, episode_id="e0", group_id="g0")
    assert events == [] and len(maker.made) == 1 and maker.made[0].commands  # set up
    clock[0] += 60.0  # it waited a minute for its step: none of it is the episode's
    result = drive(runner.episode(prepared=prepared), agent)
    assert result.reward == 1.0 and result.stop_reason == "submitted"
    assert result.turns == reference.turns and names(events)[0] == "EpisodeStarted"
    assert (events[0].episode_id, events[0].group_id) == ("e0", "g0")
    assert len(maker.made) == 1 and maker.num_open == 0


def test_a_preparation_that_failed_is_the_episodes_infra_failure_and_discard_closes_one():
    """What making the env raised when it was prepared is the episode's failure when it plays
    (as if made then); a prepared episode that will not play is closed by ``discard``."""
    maker, events, calls = SandboxMaker(), [], [0]

    def make_env():
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("no env today")
        return ShellEnv([FileTask()], sandbox=maker)

    runner = EpisodeRunner(make_env, OracleAgent(), events.append)
    failed = runner.prepare(FileTask(), episode_id="e0")
    assert events == []
    result = drive(runner.episode(prepared=failed), OracleAgent())
    assert result.infra_failure and "no env today" in events[-1].details["error"]
    unplayed = runner.prepare(FileTask(), episode_id="e1")
    assert maker.num_open == 1
    runner.discard(unplayed)
    assert maker.num_open == 0 and len(maker.made) == 1
