"""The run's one receive loop: every item routed in order, a worker's crash report or exit
raised as a WorkerError (its own traceback preferred), silence bounded by one timeout."""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

import pytest

from thundersync.training import worker_pool
from thundersync.training.worker_pool import WorkerError, WorkerPool
from thundersync.training.workers import WorkerFailed


@dataclass
class FakeWorker:
    name: str
    exitcode: int | None = None


class FakeBackend:
    """Queues in this process; ``spawn`` records a worker instead of starting one."""

    def __init__(self) -> None:
        self.workers: list[FakeWorker] = []

    def queue(self) -> queue.Queue:
        return queue.Queue()

    def spawn(self, name: str, target: Any, *args: Any, num_threads: int, output: Any) -> Any:
        self.workers.append(FakeWorker(name))
        return self.workers[-1]


@pytest.fixture
def pool(monkeypatch) -> WorkerPool:
    monkeypatch.setattr(worker_pool, "POLL_S", 0.01)
    made = WorkerPool(FakeBackend(), timeout_s=0.05)
    made.spawn("rollout", print, num_threads=1)
    return made


def test_everything_waiting_is_routed_in_order(pool):
    for item in ("a", "b", "c"):
        pool.inbox.put(item)
    routed: list[str] = []
    pool.receive(routed.append)
    assert routed == ["a", "b", "c"]


def test_a_crash_report_stops_the_run_after_what_came_before_it(pool):
    pool.inbox.put("a")
    pool.inbox.put(WorkerFailed("rollout", "Traceback: boom"))
    routed: list[str] = []
    with pytest.raises(WorkerError, match=r"the rollout worker failed:\nTraceback: boom"):
        pool.receive(routed.append)
    assert routed == ["a"]


def test_silence_is_an_error_unless_the_caller_gave_its_own_timeout(pool):
    with pytest.raises(WorkerError, match=r"no event from any worker for 0.05 s"):
        pool.receive(print)
    pool.receive(print, timeout_s=0.02)  # returns: the caller waits for something else


def test_an_exited_worker_is_named_by_its_own_report_when_it_sent_one(pool):
    pool.backend.workers[0].exitcode = 1
    with pytest.raises(WorkerError, match=r"rollout exited with code 1; continue the run"):
        pool.receive(print)
    pool.inbox.put(WorkerFailed("rollout", "Traceback: the real cause"))
    with pytest.raises(WorkerError, match=r"the real cause"):
        pool.check()


def test_a_read_cut_short_by_ctrl_c_leaves_the_inbox_drained_raw_not_decoded():
    """Ctrl-C while a message is read leaves the pipe between two frames; closing then drains
    it (so no worker blocks on a full pipe) without decoding a length read from the middle of
    a message, which raised EOFError out of the interrupted run's close, or could block."""
    import multiprocessing
    import os
    import struct

    class MpBackend(FakeBackend):
        def queue(self):
            return multiprocessing.get_context("spawn").Queue()

    pool = WorkerPool(MpBackend(), timeout_s=0.05)
    calls = [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        raise KeyboardInterrupt  # as if it landed inside the read

    real_get = pool.inbox.get
    pool.inbox.get = interrupted
    with pytest.raises(KeyboardInterrupt):
        pool.receive(lambda item: None, timeout_s=0.05)
    pool.inbox.get = real_get
    assert calls == [1]
    # the rest of a message whose first bytes were read: read as a frame, an empty "length"
    # (what the interrupted run's close raised EOFError on), then stray bytes
    os.write(pool.inbox._writer.fileno(), struct.pack("!i", 0) + b"\x00" * 10)
    assert pool._discard_inbox() == []
    assert not pool.inbox._reader.poll(0)  # every byte drained
    pool.inbox.close()


def test_the_rollout_plays_no_more_episodes_at_once_than_the_env_allows(monkeypatch):
    """Issue 35: an OpenEnv server allowing 8 sessions and a step of 16 episodes: the rollout
    worker plays at most 8 at once and makes at most 8 envs ahead (``RolloutSpec``)."""
    from thundersync.training.config import TrainConfig

    spawned: list = []

    class Pool:
        backend = type("Backend", (), {"gpu_for_rollout": False})()

        def spawn(self, name, target, *args, **kwargs):
            spawned.append((name, args))

        inbox = None

    config = TrainConfig(tasks_per_step=4, group_size=4)
    for limit, concurrency, sessions, said in (
        (
            8,
            8,
            8,
            [
                "thundersync/ToySum-v0 allows 8 sessions at once: at most 8 episodes play "
                "at a time (16 a step), the others wait for a free session"
            ],
        ),
        (None, 16, 0, []),
        (32, 16, 32, []),
    ):
        spawned.clear()
        lines: list[str] = []
        monkeypatch.setattr(worker_pool, "session_limit", lambda c, limit=limit: limit)
        worker_pool.start_rollout(
            Pool(),
            config,
            model_dir="m",
            batches_in_flight=1,
            control=None,
            teacher_inbox=None,
            weights=None,
            say=lines.append,
        )
        ((_, (spec, *_)),) = spawned
        assert (spec.max_concurrency, spec.max_sessions, lines) == (concurrency, sessions, said)


def test_the_session_limit_is_the_env_task_sources(monkeypatch):
    from thundersync.training.config import TrainConfig

    class Source:
        def max_sessions(self):
            return 8

    monkeypatch.setattr(worker_pool, "task_source", lambda env, **kw: Source())
    assert worker_pool.session_limit(TrainConfig()) == 8
    monkeypatch.setattr(worker_pool, "task_source", lambda env, **kw: object())
    assert worker_pool.session_limit(TrainConfig()) is None
