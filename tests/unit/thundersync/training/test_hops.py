"""``ThreadHops``: the driver's blocking calls run on bounded threads and awaited on its loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from thundersync.training.hops import ThreadHops

WAIT_S = 30.0  # a bound on waits that never run out on a correct implementation


def _run_on_loop(max_threads: int, body):  # type: ignore[no-untyped-def]
    """``body(hops)`` as a coroutine on a fresh loop; the hops are shut down after it."""
    loop = asyncio.new_event_loop()
    hops = ThreadHops(loop, max_threads, name="test")
    try:
        return loop.run_until_complete(body(hops))
    finally:
        loop.close()
        hops.shutdown()


def test_results_and_errors_come_back_to_their_callers() -> None:
    def fail() -> None:
        raise KeyError("boom")

    async def body(hops: ThreadHops) -> tuple[list[object], BaseException]:
        values = await asyncio.gather(*(hops.run(lambda n=n: n * n) for n in range(50)))
        with pytest.raises(KeyError, match="boom") as caught:
            await hops.run(fail)
        return values, caught.value

    values, error = _run_on_loop(4, body)
    assert values == [n * n for n in range(50)]
    assert isinstance(error, KeyError)


def test_calls_run_concurrently_on_at_most_max_threads() -> None:
    """Three calls that can only end together (a barrier of 3) end: they ran at once; twenty
    calls ran on three threads at most, each a thread of the hops'."""
    barrier = threading.Barrier(3, timeout=WAIT_S)
    names: set[str] = set()

    def together() -> None:
        names.add(threading.current_thread().name)
        barrier.wait()

    async def body(hops: ThreadHops) -> None:
        for _ in range(6):
            await asyncio.gather(*(hops.run(together) for _ in range(3)))
        await asyncio.gather(
            *(hops.run(lambda: names.add(threading.current_thread().name)) for _ in range(20))
        )

    _run_on_loop(3, body)
    assert 1 <= len(names) <= 3
    assert all(name.startswith("test_") for name in names)


def test_a_cancelled_caller_waits_for_its_call_to_end() -> None:
    """The episode's generator must not be touched while a thread runs it: cancelling the
    awaiting task returns only once the call has ended."""
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def blocking() -> str:
        started.set()
        release.wait(WAIT_S)
        ended.set()
        return "late"

    async def body(hops: ThreadHops) -> bool:
        task = asyncio.ensure_future(hops.run(blocking))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, WAIT_S)
        task.cancel()
        await asyncio.sleep(0)  # the cancellation reaches the task
        assert not task.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return ended.is_set()

    assert _run_on_loop(2, body) is True


def test_max_threads_must_be_positive() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="max_threads"):
            ThreadHops(loop, 0)
    finally:
        loop.close()
