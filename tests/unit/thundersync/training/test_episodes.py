"""InlineEpisodes plays the same episodes as a thread per episode (EpisodeThreads), on one
thread, and fails, cancels and bounds concurrency the same way; the rollout worker picks it for
envs whose steps answer at once."""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import CancelledError

import numpy as np
import pytest

import environments  # noqa: F401  (registers thundersync/ToySum-v0)
from environments.actions import format_action
from environments.core import INSTANT_STEPS
from environments.registry import episode_envs
from environments.runner import EpisodeRunner, SinkError
from environments.toy import ToySumEnv
from thundersync import events as ev
from thundersync.models import load_tokenizer
from thundersync.training.agent import PolicyAgent
from thundersync.training.chat import ChatFormat
from thundersync.training.engines.batcher import DynamicBatcher
from thundersync.training.engines.protocol import Completion
from thundersync.training.episodes import EpisodeThreads, InlineEpisodes, episode_driver
from thundersync.training.rollout import derive_seed

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
    """An engine, batcher, agent and runner over ToySum with in-process tools."""

    def __init__(
        self, tokenizer, *, max_context: int = 4096, fail: bool = False, sink=None, **env_kwargs
    ) -> None:
        self.engine = ScriptedEngine(tokenizer, fail=fail)
        self.batcher = DynamicBatcher(self.engine, max_batch_size=64)
        self.agent = PolicyAgent(
            self.batcher.generate,
            ChatFormat(tokenizer),
            policy_version=lambda: 3,
            run_seed=5,
            max_new_tokens=64,
            max_context=max_context,
        )
        self.events: list[ev.Event] = []
        self.threads: set[str] = set()

        def record(event: ev.Event) -> None:
            self.threads.add(threading.current_thread().name)
            self.events.append(event)
            if sink is not None:
                sink(event)

        kwargs = {"tools": "python", **env_kwargs}
        self.runner = EpisodeRunner(episode_envs(ENV, **kwargs), self.agent, record)

    def play(self, driver, num: int) -> list:
        rng = np.random.default_rng(0)
        tasks = [ToySumEnv(tools="python").draw_task(rng) for _ in range(num)]
        futures = []
        for i, task in enumerate(tasks):
            futures.append(
                driver.submit(
                    task=task,
                    group_id=f"g{i % 2}",
                    group_size=2,
                    seed=derive_seed(1, f"e{i}"),
                    episode_id=f"e{i}",
                )
            )
        return [f.result(timeout=60) for f in futures]

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


def test_inline_plays_exactly_what_threads_play_on_one_thread(tokenizer):
    results = {}
    for name in ("threads", "inline"):
        rig = Rig(tokenizer)
        if name == "threads":
            driver = EpisodeThreads(rig.runner, rig.batcher, 8)
        else:
            driver = InlineEpisodes(rig.runner, rig.batcher, max_concurrency=8)
        trajectories = rig.play(driver, 8)
        driver.shutdown()
        rig.close()
        results[name] = (trajectories, per_episode(rig.events), rig.threads, rig.engine.batches)
    threads, inline = results["threads"], results["inline"]
    assert inline[0] == threads[0]
    assert inline[1] == threads[1]
    lengths = {len(t.turns) for t in inline[0]}
    assert len(lengths) > 1 and not any(t.infra_failure for t in inline[0])
    assert inline[2] == {"episodes"}  # every env call and event on the driver's thread
    assert len(threads[2]) > 1
    assert sum(inline[3]) == sum(len(t.turns) for t in inline[0])


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
    driver = InlineEpisodes(rig.runner, rig.batcher, max_concurrency=3)
    rng = np.random.default_rng(0)
    futures = [
        driver.submit(
            task=ToySumEnv(tools="python").draw_task(rng),
            group_id="g",
            group_size=2,
            seed=i,
            episode_id=f"e{i}",
        )
        for i in range(10)
    ]
    gate.set()
    trajectories = [f.result(timeout=60) for f in futures]
    driver.shutdown()
    rig.close()
    assert len(trajectories) == 10 and most[0] == 3 and max(rig.engine.batches) <= 3


def test_a_bad_submission_fails_its_own_future_and_a_shut_driver_takes_no_more(tokenizer):
    rig = Rig(tokenizer)
    driver = InlineEpisodes(rig.runner, rig.batcher, max_concurrency=2)
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
    played = {}
    for name in ("threads", "inline"):
        rig = Rig(tokenizer, max_context=120)
        if name == "threads":
            driver = EpisodeThreads(rig.runner, rig.batcher, 4)
        else:
            driver = InlineEpisodes(rig.runner, rig.batcher, max_concurrency=4)
        played[name] = rig.play(driver, 4)
        driver.shutdown()
        rig.close()
    trajectories = played["inline"]
    assert trajectories == played["threads"]
    assert {t.stop_reason for t in trajectories} <= {"length", "submitted"}
    assert any(t.stop_reason == "length" and t.turns and not t.infra_failure for t in trajectories)


def test_a_dead_engine_is_each_episodes_infra_failure(tokenizer):
    rig = Rig(tokenizer, fail=True)
    driver = InlineEpisodes(rig.runner, rig.batcher, max_concurrency=4)
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


def test_a_broken_sink_escapes_through_the_episodes_future(tokenizer):
    def broken(event: ev.Event) -> None:
        if isinstance(event, ev.TurnCompleted):
            raise OSError("queue closed")

    rig = Rig(tokenizer, sink=broken)
    driver = InlineEpisodes(rig.runner, rig.batcher, max_concurrency=4)
    with pytest.raises(SinkError, match="queue closed"):
        rig.play(driver, 2)
    driver.shutdown()
    assert rig.batcher._requesters == 0
    rig.close()


def test_cancel_then_shutdown_ends_live_episodes_and_drops_queued_ones(tokenizer):
    started, two_started = [], threading.Event()

    def count(event: ev.Event) -> None:
        if isinstance(event, ev.EpisodeStarted):
            started.append(event.episode_id)
            if len(started) == 2:
                two_started.set()

    rig = Rig(tokenizer, sink=count)
    gate = hold_engine(rig)  # no episode ends until the run is cancelled and shut
    driver = InlineEpisodes(rig.runner, rig.batcher, max_concurrency=2)
    rng = np.random.default_rng(0)
    futures = []
    for i in range(5):
        futures.append(
            driver.submit(task=ToySumEnv(tools="python").draw_task(rng), episode_id=f"e{i}")
        )
    dropped = threading.Semaphore(0)
    for future in futures[2:]:
        future.add_done_callback(lambda _: dropped.release())
    # Two episodes are live, waiting on the held engine, so the other three stay queued (the
    # driver starts no third while two are live, and neither can end before the gate opens).
    assert two_started.wait(30)
    rig.runner.cancel("stopping")
    stopper = threading.Thread(target=driver.shutdown)
    stopper.start()
    for _ in futures[2:]:  # the queued ones are dropped while the live ones still wait
        assert dropped.acquire(timeout=30)
    assert started == ["e0", "e1"] and all(f.cancelled() for f in futures[2:])
    gate.set()
    stopper.join(30)
    assert not stopper.is_alive()
    live = [f.result(timeout=1) for f in futures if not f.cancelled()]
    assert len(live) == 2 and all(t.details.get("cancelled") == "stopping" for t in live)
    with pytest.raises(CancelledError):
        futures[-1].result(timeout=1)
    assert rig.batcher._requesters == 0
    rig.close()


@pytest.mark.parametrize(
    ("kwargs", "instant"),
    [
        ({"tools": "python"}, True),
        ({"tools": "python", "tool_latency_s": 0.01}, False),
        ({"tools": "python", "grade_latency_s": 0.01}, False),
        ({"sandbox": "bwrap"}, False),
    ],
)
def test_the_worker_runs_episodes_inline_only_where_steps_answer_at_once(
    tokenizer, kwargs, instant
):
    import gymnasium

    env = gymnasium.make(ENV, **kwargs)
    assert env.metadata.get(INSTANT_STEPS, False) is instant
    env.close()
    rig = Rig(tokenizer)
    driver = episode_driver(rig.runner, rig.batcher, lambda: gymnasium.make(ENV, **kwargs), 4)
    assert isinstance(driver, InlineEpisodes if instant else EpisodeThreads)
    driver.shutdown()
    rig.close()
