"""Dynamic batching: requests from concurrent episodes, which arrive at different times (after
their tool calls), are generated together instead of one episode at a time."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from thundersync.protocol.events import now
from thundersync.training.engines.engine import Completion, Engine, GenerationRequest

BatchHook = Callable[[float, float, list[GenerationRequest], list[Completion]], None]


MAX_WINDOWS = 10
"""A batch gathers for at most this many windows, however steadily requests arrive."""


class EngineClosedError(RuntimeError):
    """The batcher was closed (or its engine failed) while a request waited."""


class DynamicBatcher:
    """Owns the engine on one thread. ``generate`` (any thread) blocks until its request was
    sampled as part of a batch: everything waiting, gathered until no request has arrived for
    ``window_s`` (at most ``MAX_WINDOWS`` windows in all), up to ``max_batch_size``. Callers
    that will ask (episodes in flight) are counted with ``join()`` (when the episode is
    scheduled, so that none is missed while threads start) and ``leave()``, and those inside a
    call that asks for nothing (a sandboxed command, a grader) with ``away()`` and ``back()``; a
    batch then closes as soon as every counted caller not away has a request in it, instead of
    waiting out the window for nobody. ``call(fn)`` runs ``fn(engine)`` on the engine thread
    between batches (weight loads: no batch ever sees half-loaded weights). ``on_batch(started,
    finished, requests, completions)`` observes every batch; ``add_settle_hook`` wakes a
    consumer of many futures once per batch. A request submitted ``then_away`` counts its
    caller away from the moment its completion is settled (the engine's thread does it, before
    the caller can run): an episode whose next call is a tool's, which a batch gathering
    meanwhile should not wait for; the caller's ``back()`` ends it."""

    def __init__(
        self,
        engine: Engine,
        *,
        window_s: float = 0.005,
        max_batch_size: int = 64,
        on_batch: BatchHook | None = None,
    ) -> None:
        self.engine = engine
        self.window_s = window_s
        self.max_batch_size = max_batch_size
        self.on_batch = on_batch
        # (kind, payload, future, then_away)
        self._inbox: queue.Queue[tuple[str, Any, Future, bool]] = queue.Queue()
        self._requesters = 0
        self._away = 0  # counted callers inside a call that does not ask for an action
        self._requesters_lock = threading.Lock()
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._settle_hooks: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def join(self) -> None:
        """Count one more caller that will call ``generate`` until its ``leave()``."""
        with self._requesters_lock:
            self._requesters += 1

    def leave(self) -> None:
        with self._requesters_lock:
            self._requesters -= 1
        self._inbox.put(("wake", None, Future(), False))  # a gathering batch may be complete now

    def away(self) -> None:
        """A counted caller goes where it will not ask for a while (a sandboxed command, a
        grader: until its ``back()``): a gathering batch stops waiting for it."""
        with self._requesters_lock:
            self._away += 1
        self._inbox.put(("wake", None, Future(), False))

    def back(self) -> None:
        with self._requesters_lock:
            self._away -= 1

    def add_settle_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook()`` on the engine thread each time a batch's futures are all settled
        (completions or errors; also when ``close`` fails the waiting ones) and ``on_batch`` has
        observed it (a batch is recorded before its episodes move on), so that a consumer
        waiting on many of them, an event loop, is woken once per batch: a wake-up per future
        hands it the interpreter while the engine thread still has futures to settle."""
        self._settle_hooks.append(hook)

    def remove_settle_hook(self, hook: Callable[[], None]) -> None:
        self._settle_hooks.remove(hook)

    def _settled(self) -> None:
        for hook in list(self._settle_hooks):
            hook()

    def _batch_target(self) -> int:
        requesters = self._requesters
        if not requesters:
            return self.max_batch_size
        return min(self.max_batch_size, max(requesters - self._away, 1))

    def generate(self, request: GenerationRequest) -> Completion:
        return self.submit(request).result()

    def submit(self, request: GenerationRequest, *, then_away: bool = False) -> Future:
        """``generate`` without waiting: a future of the ``Completion``. ``then_away``: the
        caller is counted away once it is settled, until its ``back()`` (see the class
        docstring)."""
        return self._submit("generate", request, then_away)

    def call(self, fn: Callable[[Engine], Any]) -> Any:
        return self._submit("call", fn).result()

    def _submit(self, kind: str, payload: Any, then_away: bool = False) -> Future:
        if self._closed.is_set():
            raise EngineClosedError(f"the engine is closed ({self._error or 'stopped'})")
        future: Future = Future()
        self._inbox.put((kind, payload, future, then_away))
        return future

    def close(self) -> None:
        """Stop the engine thread; waiting requests fail with EngineClosedError."""
        if not self._closed.is_set():
            self._closed.set()
            self._inbox.put(("stop", None, Future(), False))
            self._thread.join(timeout=60)
        self._fail_waiting(EngineClosedError("the engine was closed"))

    # --- the engine thread -------------------------------------------------------------------

    def _loop(self) -> None:
        pending: tuple[str, Any, Future, bool] | None = None
        while True:
            item = pending or self._inbox.get()
            pending = None
            kind, payload, future, _ = item
            if kind == "stop":
                return
            if kind == "call":
                self._run(future, payload)
                continue
            if kind == "wake":
                continue
            batch = [item]
            first = now()
            deadline = first + self.window_s
            while len(batch) < self._batch_target():
                try:
                    nxt = self._inbox.get(timeout=max(0.0, deadline - now()))
                except queue.Empty:
                    break
                if nxt[0] == "wake":
                    continue
                if nxt[0] != "generate":
                    pending = nxt  # a weight load or stop waits for this batch
                    break
                batch.append(nxt)
                deadline = min(now() + self.window_s, first + MAX_WINDOWS * self.window_s)
            self._generate(batch)

    def _generate(self, batch: list[tuple[str, Any, Future, bool]]) -> None:
        requests = [payload for _, payload, _, _ in batch]
        started = now()
        try:
            completions = self.engine.generate(requests)
        except BaseException as exc:  # the engine failed: every waiter learns why
            self._error = exc
            self._count_away(batch)
            for _, _, future, _ in batch:
                future.set_exception(EngineClosedError(f"the engine failed: {exc!r}"))
            self._settled()
            if not isinstance(exc, Exception):
                raise
            return
        finished = now()
        self._count_away(batch)
        for (_, _, future, _), completion in zip(batch, completions):
            future.set_result(completion)
        if self.on_batch is not None:
            self.on_batch(started, finished, requests, completions)
        self._settled()

    def _count_away(self, items: list[tuple[str, Any, Future, bool]]) -> None:
        """Count away the callers of ``items`` submitted ``then_away``, before they are
        settled (so a caller's ``back()`` never comes first)."""
        leaving = sum(then_away for _, _, _, then_away in items)
        if leaving:
            with self._requesters_lock:
                self._away += leaving

    def _run(self, future: Future, fn: Callable[[Engine], Any]) -> None:
        try:
            future.set_result(fn(self.engine))
        except Exception as exc:
            future.set_exception(exc)

    def _fail_waiting(self, error: BaseException) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                self._settled()
                return
            _, _, future, _ = item
            if not future.done():
                self._count_away([item])
                future.set_exception(error)
