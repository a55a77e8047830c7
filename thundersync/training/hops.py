"""``ThreadHops``: blocking calls run on a bounded set of threads and awaited on an asyncio loop
(``EpisodeDriver``'s env calls: a sandboxed command, a grader, making a sandbox).

``loop.run_in_executor`` costs, per call, a ``ThreadPoolExecutor.submit`` (two locks that the
pool's threads also take, so the loop's thread waits on them while the interpreter changes
hands) and a wake-up of the loop through its socket for each result. When a batch of completions
sends dozens of episodes to their tools at once, those costs add up on the loop's thread, in
series, before the last episode's tool starts, and the engine waits for them (docs/design.md §5).
Here a call is a put on a ``queue.SimpleQueue`` (one C call, no lock shared with the threads'
Python) that idle threads take from, and the results that come back while the loop is busy are
delivered in one wake-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

_STOP = None


class ThreadHops:
    """Runs calls on at most ``max_threads`` threads (started as calls need them) for ``loop``,
    the loop that awaits them. ``run`` is called on ``loop``; ``shutdown`` from any other thread
    once no call is awaited."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, max_threads: int, *, name: str = "hop"
    ) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self._loop = loop
        self._max_threads = max_threads
        self._name = name
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._running = 0  # calls put and not delivered (loop's thread)
        self._done: deque[tuple[asyncio.Future[Any], bool, Any]] = deque()
        self._waking = False  # a delivery is scheduled on the loop

    async def run(self, call: Callable[[], Any]) -> Any:
        """``call()`` on a thread; its result, or what it raised. Awaited to its end even if
        the awaiting task is cancelled (the call cannot be stopped), then CancelledError."""
        result: asyncio.Future[Any] = self._loop.create_future()
        self._running += 1
        if self._running > len(self._threads) and len(self._threads) < self._max_threads:
            thread = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        self._calls.put((call, result))
        try:
            return await asyncio.shield(result)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await result
            raise

    def shutdown(self) -> None:
        """Stop the threads (each ends after the call it runs, if any) and wait for them."""
        for _ in self._threads:
            self._calls.put(_STOP)
        for thread in self._threads:
            thread.join()

    def _work(self) -> None:
        while (item := self._calls.get()) is not _STOP:
            call, result = item
            try:
                done = (result, True, call())
            except BaseException as exc:  # delivered to the awaiting task
                done = (result, False, exc)
            self._done.append(done)
            del item, call, result, done  # no reference kept while the thread waits
            if not self._waking:  # a second wake-up is harmless; a missing one is not
                self._waking = True
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: nobody awaits the result
                    return

    def _deliver(self) -> None:
        self._waking = False  # before draining: a result appended after this wakes again
        while self._done:
            result, ok, value = self._done.popleft()
            self._running -= 1
            if result.cancelled():
                continue
            if ok:
                result.set_result(value)
            else:
                result.set_exception(value)
