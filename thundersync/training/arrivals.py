"""``BatchArrivals``: a batcher's futures as awaitables on an asyncio loop, delivered once per
batch (``EpisodeDriver``'s actions await them)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any


class BatchArrivals:
    """A batch's completions arrive together: they are queued as the engine's thread settles
    them, and ``loop`` (run by ``loop_thread``) is woken once, when the whole batch is settled
    (``wake``: the batcher's ``add_settle_hook``), not once per episode as with
    ``asyncio.wrap_future``, where each wake-up hands the interpreter to the loop's thread
    while the engine's still has futures to settle."""

    def __init__(self, loop: asyncio.AbstractEventLoop, loop_thread: threading.Thread) -> None:
        self._loop = loop
        self._loop_thread = loop_thread
        self._arrived: list[tuple[asyncio.Future[Any], Future[Any]]] = []
        self._lock = threading.Lock()
        self._waking = False  # a delivery is scheduled on the loop

    def awaitable(self, pending: Future[Any]) -> asyncio.Future[Any]:
        """``pending`` (a batcher's future) as an awaitable on the loop (call it there)."""
        arrived = self._loop.create_future()
        pending.add_done_callback(lambda done: self._arrive(arrived, done))
        return arrived

    def wake(self) -> None:
        """The batcher's settle hook (the engine's thread): deliver what arrived, if any."""
        with self._lock:
            if not self._arrived or self._waking:
                return
            self._waking = True
        self._loop.call_soon_threadsafe(self._deliver)

    def _arrive(self, arrived: asyncio.Future[Any], done: Future[Any]) -> None:
        if threading.get_ident() == self._loop_thread.ident:  # settled before it was awaited
            _settle(arrived, done)
            return
        with self._lock:
            self._arrived.append((arrived, done))

    def _deliver(self) -> None:
        with self._lock:
            arrived, self._arrived = self._arrived, []
            self._waking = False
        for awaited, done in arrived:
            _settle(awaited, done)


def _settle(arrived: asyncio.Future[Any], done: Future[Any]) -> None:
    """Give the loop's ``arrived`` the outcome of the settled ``done``."""
    if arrived.cancelled():
        return
    if done.cancelled():
        arrived.cancel()
    elif (error := done.exception()) is not None:
        arrived.set_exception(error)
    else:
        arrived.set_result(done.result())
