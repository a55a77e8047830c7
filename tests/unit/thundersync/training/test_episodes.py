"""EpisodeDriver plays, as coroutines on one asyncio loop, exactly the episodes ``run_episode``
plays one at a time; bounds concurrency; keeps one episode's failure that episode's; drops
queued episodes and ends live ones on cancel and shutdown, leaving no thread behind; and a
step that blocks delays only its own episode."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import CancelledError

import gymnasium as gym
import numpy as np
import pytest

import environments  # noqa: F401  (registers thundersync/ToySum-v0)
from environments.actions import format_action
from environments.agents import OracleAgent
from environments.core import INSTANT_STEPS
from environments.registry import episode_envs
from environments.runner import EpisodeRunner, SinkError
from environments.toy import ToySumEnv
from thundersync import events as ev
from thundersync.models import load_tokenizer
from thundersync.training.agent import PolicyAgent
from thundersync.training.chat import ChatFormat
from thundersync.training.engines.batcher import DynamicBatcher
from thundersync.training.engines.engine import Completion
from thundersync.training.episodes import EpisodeDriver
from thundersync.training.rollout_worker import derive_seed

ENV = "thundersync/ToySum-v0"


class ScriptedEngine:
    """Answers each request with an action chosen by its seed (a lookup, a wrong or malformed
    action, or a submission), so episodes take different numbers of turns; records batches."""

    policy_version = 3
    max_context = 4096

    def __init__(self, tokenizer, *, fail: bool = False) -> None:
        self.tokenizer = tokenizer
        self.fail = fail
        self.batches: list[int] = []
        self.stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, requests):
        if self.fail:
            raise RuntimeError("engine died")
        self.batches.append(len(requests))
        return [self._complete(r.seed) for r in requests]

    def _complete(self, seed: int) -> Completion:
        text = [
            format_action("lookup red"),
            format_action("calc 2+3"),
            "no block here",
            format_action("answer 5"),
            format_action("submit"),
        ][seed % 5]
        ids = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + (self.stop_id,)
        return Completion(
            ids, tuple(-0.01 * (i + 1) for i in range(len(ids))), "stop", self.policy_version
        )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dirs):
    return load_tokenizer(tiny_model_dirs["qwen3"])


class Rig:
    """An engine, batcher, agent and runner over ToySum (in-process tools unless told)."""

    def __init__(
        self,
        tokenizer,
        *,
        max_context: int = 4096,
        fail: bool = False,
        sink=None,
        make_env=None,
        window_s: float = 0.005,
        **env_kwargs,
    ) -> None:
        self.engine = ScriptedEngine(tokenizer, fail=fail)
        self.batcher = DynamicBatcher(self.engine, window_s=window_s, max_batch_size=64)
        self.agent = PolicyAgent(
            self.batcher.generate,
            ChatFormat(tokenizer),
            policy_version=lambda: 3,
            run_seed=5,
            max_new_tokens=64,
            max_context=max_context,
        )
        self.events: list[ev.Event] = []
        self.threads: dict[str, set[str]] = {}  # event type -> the threads that published it

        def record(event: ev.Event) -> None:
            name = type(event).__name__
            self.threads.setdefault(name, set()).add(threading.current_thread().name)
            self.events.append(event)
            if sink is not None:
                sink(event)

        kwargs = {"tools": "python", **env_kwargs}
        self.runner = EpisodeRunner(make_env or episode_envs(ENV, **kwargs), self.agent, record)

    def jobs(self, num: int) -> list[dict]:
        rng = np.random.default_rng(0)
        return [
            {
                "task": ToySumEnv(tools="python").draw_task(rng),
                "group_id": f"g{i % 2}",
                "group_size": 2,
                "seed": derive_seed(1, f"e{i}"),
                "episode_id": f"e{i}",
            }
            for i in range(num)
        ]

    def play(self, driver: EpisodeDriver, num: int) -> list:
        futures = [driver.submit(**job) for job in self.jobs(num)]
        return [f.result(timeout=60) for f in futures]

    def reference(self, num: int) -> list:
        """The same episodes, one after another on this thread (``run_episode``)."""
        return [self.runner.run_episode(**job) for job in self.jobs(num)]

    def close(self) -> None:
        self.batcher.close()


def hold_engine(rig: Rig) -> threading.Event:
    """Make ``rig``'s engine wait, on every batch, until the returned event is set: no episode
    can end before the test lets it, however the threads are scheduled."""
    gate, generate = threading.Event(), rig.engine.generate

    def held(requests):
        assert gate.wait(60), "the test never released the engine"
        return generate(requests)

    rig.engine.generate = held
    return gate


def per_episode(events: list[ev.Event]) -> dict[str, list]:
    """Each episode's events in order, without their timestamps."""
    out: dict[str, list] = {}
    for event in events:
        fields = {
            f.name: getattr(event, f.name) for f in dataclasses.fields(event) if f.name != "t"
        }
        out.setdefault(event.episode_id, []).append((type(event).__name__, fields))
    return out


@pytest.mark.parametrize(
    ("kwargs", "instant"),
    [({"tools": "python"}, True), ({"tools": "python", "tool_latency_s": 0.001}, False)],
)
def test_the_driver_plays_exactly_what_run_episode_plays(tokenizer, kwargs, instant):
    assert gym.make(ENV, **kwargs).metadata.get(INSTANT_STEPS, False) is instant
    played = {}
    for name in ("reference", "driver"):
        # The driver's batches close only once every live episode has asked (an endless
        # window); the reference's at once (a window of 0: nobody else is counted).
        rig = Rig(tokenizer, window_s=0.0 if name == "reference" else 60.0, **kwargs)
        if name == "reference":
            trajectories = rig.reference(8)
        else:
            driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=8)
            futures = driver.submit_all(rig.jobs(8))
            trajectories = [f.result(timeout=60) for f in futures]
            driver.shutdown()
        rig.close()
        played[name] = (trajectories, per_episode(rig.events), rig.threads, rig.engine.batches)
    reference, driven = played["reference"], played["driver"]
    assert driven[0] == reference[0] and driven[1] == reference[1]
    assert len({len(t.turns) for t in driven[0]}) > 1
    assert not any(t.infra_failure for t in driven[0])
    # The first batch holds every episode submitted (no env had said where its steps run, so
    # none was counted away while its env was made). Stepped on the loop, every live
    # episode's turn in one batch; stepped on the pool, a batch does not wait for the episodes
    # inside their env calls (``DynamicBatcher.away``): it holds the requests that came.
    turns = [len(t.turns) for t in reference[0]]
    if instant:
        assert driven[3] == [sum(n > i for n in turns) for i in range(max(turns))]
    else:
        assert driven[3][0] == 8 and sum(driven[3]) == sum(turns)
    assert reference[3] == [1] * sum(turns)
    # An env that declares instant steps is stepped on the loop's thread; any other on a
    # thread of the pool, so that a blocking step holds no other episode.
    stepped = driven[2]["TurnCompleted"] | driven[2]["RewardReady"]
    if instant:
        assert stepped == {"episodes"}
    else:
        assert stepped and all(name.startswith("episode_") for name in stepped)


def test_an_agent_without_an_engine_acts_on_the_pool(tokenizer):
    rig = Rig(tokenizer)
    rig.runner.agent = OracleAgent()
    reference = rig.reference(4)
    driver = EpisodeDriver(rig.runner, max_concurrency=2)
    assert rig.play(driver, 4) == reference
    driver.shutdown()
    rig.close()
    assert all(t.reward == 1.0 for t in reference)


def test_concurrency_is_bounded_and_queued_episodes_start_as_others_end(tokenizer):
    live, most = [0], [0]

    def count(event: ev.Event) -> None:
        if isinstance(event, ev.EpisodeStarted):
            live[0] += 1
            most[0] = max(most[0], live[0])
        elif isinstance(event, ev.RewardReady):
            live[0] -= 1

    rig = Rig(tokenizer, sink=count)
    gate = hold_engine(rig)  # every episode is queued before any can end
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=3)
    futures = [driver.submit(**job) for job in rig.jobs(10)]
    gate.set()
    trajectories = [f.result(timeout=60) for f in futures]
    driver.shutdown()
    rig.close()
    assert len(trajectories) == 10 and most[0] == 3 and max(rig.engine.batches) <= 3


def test_a_bad_submission_fails_its_own_future_and_a_shut_driver_takes_no_more(tokenizer):
    rig = Rig(tokenizer)
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=2)
    bad = driver.submit(task=None, colour="red")
    assert len(rig.play(driver, 3)) == 3
    with pytest.raises(TypeError, match="colour"):
        bad.result(timeout=10)
    driver.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        driver.submit(task=None)
    assert rig.batcher._requesters == 0
    rig.close()


def test_a_full_context_window_ends_the_episode_as_truncation(tokenizer):
    rig = Rig(tokenizer, max_context=120)
    reference = rig.reference(4)
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=4)
    trajectories = rig.play(driver, 4)
    driver.shutdown()
    rig.close()
    assert trajectories == reference
    assert {t.stop_reason for t in trajectories} <= {"length", "submitted"}
    assert any(t.stop_reason == "length" and t.turns and not t.infra_failure for t in trajectories)


def test_a_dead_engine_is_each_episodes_infra_failure(tokenizer):
    rig = Rig(tokenizer, fail=True)
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=4)
    trajectories = rig.play(driver, 4)
    driver.shutdown()
    rig.close()
    assert all(t.infra_failure and "engine died" in t.details["error"] for t in trajectories)
    assert rig.batcher._requesters == 0
    assert [name for name, _ in per_episode(rig.events)["e0"]] == [
        "EpisodeStarted",
        "EpisodeCompleted",
        "RewardReady",
    ]


def test_one_episodes_broken_sink_fails_that_episode_only_and_closes_its_env(tokenizer):
    def broken(event: ev.Event) -> None:
        if isinstance(event, ev.TurnCompleted) and event.episode_id == "e1":
            raise OSError("queue closed")

    closed: list[int] = []

    class Counted(gym.Wrapper):
        def close(self):
            closed.append(1)
            return super().close()

    make = episode_envs(ENV, tools="python", tool_latency_s=0.001)
    rig = Rig(tokenizer, sink=broken, make_env=lambda: Counted(make()))
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=4)
    futures = [driver.submit(**job) for job in rig.jobs(4)]
    with pytest.raises(SinkError, match="queue closed"):
        futures[1].result(timeout=60)
    others = [futures[i].result(timeout=60) for i in (0, 2, 3)]
    driver.shutdown()
    assert not any(t.infra_failure for t in others) and len(closed) == 4
    assert rig.batcher._requesters == 0
    rig.close()


@pytest.mark.parametrize("window_s", [0.005, 60.0])
def test_a_blocking_step_holds_only_its_own_episode(tokenizer, window_s):
    """The other episodes play to their ends while one episode's step blocks, even with a
    batching window of 60 s: the batcher knows that an episode inside a step on the pool will
    not ask before it returns (``DynamicBatcher.away``)."""
    release, blocked = threading.Event(), threading.Event()
    made = [0]
    make = episode_envs(ENV, tools="python", tool_latency_s=0.001)  # steps on the pool

    class Blocking(gym.Wrapper):
        def step(self, action):
            blocked.set()
            assert release.wait(60), "the test never released the step"
            return super().step(action)

    def make_env():
        made[0] += 1
        return Blocking(make()) if made[0] == 1 else make()

    rig = Rig(tokenizer, make_env=make_env, window_s=window_s)
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=4)
    futures = [driver.submit(**job) for job in rig.jobs(4)]
    assert blocked.wait(30)
    try:
        others = [f.result(timeout=30) for f in futures[1:]]  # while the first one's step waits
        assert not futures[0].done() and not any(t.infra_failure for t in others)
    finally:
        release.set()
    assert not futures[0].result(timeout=60).infra_failure
    driver.shutdown()
    rig.close()


def test_cancel_then_shutdown_ends_live_episodes_drops_queued_ones_and_leaks_no_thread(tokenizer):
    started, two_started = [], threading.Event()

    def count(event: ev.Event) -> None:
        if isinstance(event, ev.EpisodeStarted):
            started.append(event.episode_id)
            if len(started) == 2:
                two_started.set()

    rig = Rig(tokenizer, sink=count, tool_latency_s=0.001)
    gate = hold_engine(rig)  # no episode ends until the run is cancelled and shut
    before = set(threading.enumerate())
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=2)
    futures = [driver.submit(**job) for job in rig.jobs(6)]
    assert futures[-1].cancel()  # a caller may drop an episode before it starts
    dropped = threading.Semaphore(0)
    for future in futures[2:5]:
        future.add_done_callback(lambda _: dropped.release())
    # Two episodes are live, waiting on the held engine, so the others stay queued (the
    # driver starts no third while two are live, and neither can end before the gate opens).
    assert two_started.wait(30)
    rig.runner.cancel("stopping")
    stopper = threading.Thread(target=driver.shutdown)
    stopper.start()
    for _ in futures[2:5]:  # the queued ones are dropped while the live ones still wait
        assert dropped.acquire(timeout=30)
    assert sorted(started) == ["e0", "e1"] and all(f.cancelled() for f in futures[2:])
    assert not any(f.done() for f in futures[:2])
    gate.set()
    stopper.join(30)
    assert not stopper.is_alive()
    live = [f.result(timeout=1) for f in futures[:2]]
    assert all(t.infra_failure and t.details.get("cancelled") == "stopping" for t in live)
    with pytest.raises(CancelledError):
        futures[-1].result(timeout=1)
    assert rig.batcher._requesters == 0
    assert set(threading.enumerate()) - before == set()
    rig.close()


class CountingEnvs:
    """``make_env`` for ToySum that counts the envs made and closed."""

    def __init__(self, **env_kwargs) -> None:
        self.make = episode_envs(ENV, **{"tools": "python", **env_kwargs})
        self.made, self.closed = 0, 0
        self.lock = threading.Lock()

    def __call__(self):
        envs, env = self, self.make()

        class Counted(gym.Wrapper):
            def close(self):
                with envs.lock:
                    envs.closed += 1
                return super().close()

        with self.lock:
            self.made += 1
        return Counted(env)


@pytest.mark.parametrize("kwargs", [{}, {"tool_latency_s": 0.001}])
def test_episodes_prepared_ahead_play_exactly_as_unprepared_ones_in_the_envs_made_then(
    tokenizer, kwargs
):
    """What the rollout worker does while the learner trains: the next step's envs are made
    and reset ahead, publishing nothing; the submitted episodes then play in those envs (no
    env made twice) and publish exactly what they would have, and all of them are in the
    first batch at once (none is still making its env)."""
    reference = Rig(tokenizer, window_s=60.0, **kwargs)
    driver = EpisodeDriver(reference.runner, reference.batcher, max_concurrency=8)
    expected = [f.result(timeout=60) for f in driver.submit_all(reference.jobs(8))]
    driver.shutdown()
    reference.close()

    envs = CountingEnvs(**kwargs)
    rig = Rig(tokenizer, window_s=60.0, make_env=envs, **kwargs)
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=8)
    for made in driver.prepare_all(rig.jobs(8)):
        assert made.result(timeout=60) is None
    assert envs.made == 8 and rig.events == [] and rig.engine.batches == []
    trajectories = [f.result(timeout=60) for f in driver.submit_all(rig.jobs(8))]
    driver.shutdown()
    rig.close()
    assert trajectories == expected and per_episode(rig.events) == per_episode(reference.events)
    assert envs.made == 8 and envs.closed == 8
    assert rig.engine.batches[0] == 8


def test_preparing_waits_for_the_live_episodes_and_unplayed_preparations_are_closed(tokenizer):
    """Preparations start only once no episode plays (they would slow the live ones); one made
    for other arguments is closed and the episode makes its own env; those never submitted
    are closed at shutdown."""
    envs = CountingEnvs()
    rig = Rig(tokenizer, make_env=envs)
    gate = hold_engine(rig)
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=4)
    jobs = rig.jobs(6)
    live = driver.submit_all(jobs[:2])
    made = driver.prepare_all(jobs[2:])
    with pytest.raises(TimeoutError):  # two episodes wait on the held engine
        made[0].result(timeout=0.2)
    gate.set()
    assert all(t.reward is not None for t in (f.result(timeout=60) for f in live))
    for future in made:
        future.result(timeout=60)
    assert envs.made == 6
    other = {**jobs[2], "seed": jobs[2]["seed"] + 1}  # not what was prepared
    played = driver.submit(**other).result(timeout=60)
    assert played == rig.runner.run_episode(**other)
    assert envs.made == 8  # its own env (and the reference's), not the one prepared
    driver.shutdown()  # three preparations were never submitted
    rig.close()
    assert envs.closed == envs.made


def test_no_more_envs_are_prepared_ahead_than_the_env_allows_open(tokenizer):
    """An env whose server allows so many sessions (``max_prepared``): a prepared env holds
    one until its episode plays, so the next step's envs made ahead stay within it (issue 35:
    a step's 16 envs opened ahead on a server allowing 8 left 8 episodes without a session,
    each an infrastructure failure). The others make their envs when they play."""
    envs = CountingEnvs()
    rig = Rig(tokenizer, make_env=envs)
    driver = EpisodeDriver(rig.runner, rig.batcher, max_concurrency=3, max_prepared=3)
    made = driver.prepare_all(rig.jobs(6))
    assert [f.result(timeout=60) for f in made[:3]] == [None] * 3
    assert all(f.cancelled() for f in made[3:])
    assert envs.made == 3
    trajectories = [f.result(timeout=60) for f in driver.submit_all(rig.jobs(6))]
    driver.shutdown()
    rig.close()
    assert [t.infra_failure for t in trajectories] == [False] * 6
    assert envs.made == envs.closed == 6
