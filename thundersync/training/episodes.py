"""``EpisodeDriver``: how the rollout worker, evaluation and the benchmark play episodes, as
coroutines on one asyncio loop.

Each episode is the runner's generator (``EpisodeRunner.episode``: the same events, failures
and cancellation as ``run_episode``) advanced by a coroutine. An action awaits the engine's
batched completion (``PolicyAgent.request``, the ``DynamicBatcher``'s future, then
``PolicyAgent.action``), so every live episode's request waits in the same batch and no thread
is parked per episode. An env call that may block (making a sandbox, a sandboxed command, a
grader) runs on a bounded pool of threads, and the batcher does not wait for the episode
meanwhile (``DynamicBatcher.away``: its next request comes only after the call). An env that
declares that its steps answer at once (``environments.core.INSTANT_STEPS``, carried by
``ActionNeeded.instant_steps``) is stepped on the loop itself: a thread hop per turn costs the
interpreter changing hands twice, which is most of what the engine would wait for between two
batches (docs/design.md §5). An episode's first call (making and resetting its env) runs where
the previous episode's env said its steps run: a runner's envs all come from one ``make_env``,
and resets that hop to threads all at once reach the batcher staggered, splitting the first
batch. Until some env has said, a first call runs on the pool without the episode counted away,
so the first batch still waits for every episode.
An ``asyncio.Semaphore`` bounds the episodes live at once (``max_concurrency``).

Without a batcher (agents that need no engine: the oracle, scripted agents) each action is the
agent's ``act``, on the pool of threads, since an agent may block.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from environments.agents import Action
from environments.episode_steps import ActionNeeded, EpisodeSteps
from environments.runner import EpisodeRunner
from thundersync.protocol.events import now
from thundersync.protocol.types import Trajectory
from thundersync.training.engines.batcher import DynamicBatcher


class EpisodeDriver:
    """Plays ``runner``'s episodes on one asyncio loop (a thread of its own), at most
    ``max_concurrency`` at once, their actions sampled through ``batcher`` (``runner.agent`` is
    then a ``PolicyAgent``, or wraps one: ``request`` and ``action``) or, without one, by
    ``runner.agent.act``.

    ``submit`` (any thread) queues an episode and returns the future of its ``Trajectory``; an
    episode's failure is its trajectory's (an infrastructure failure, as ``run_episode``
    records it), and only what the runner lets escape (a ``SinkError``, arguments it does not
    take) is the future's exception. The batcher counts each episode from its ``submit`` until
    it ends (``join``/``leave``), so that a batch holding every live episode's request runs at
    once. Cancelling a future before its episode starts drops it; a live episode plays on (end
    it with ``runner.cancel``). ``shutdown`` drops the queued episodes, waits for the live ones
    to end (at once after ``runner.cancel``), then stops the loop and its threads.
    """

    def __init__(
        self,
        runner: EpisodeRunner,
        batcher: DynamicBatcher | None = None,
        *,
        max_concurrency: int,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.runner = runner
        self.agent: Any = runner.agent
        self.batcher = batcher
        self.max_concurrency = max_concurrency
        # One thread per live episode at most: an episode runs one env call or action at a time.
        self._threads = ThreadPoolExecutor(max_concurrency, thread_name_prefix="episode")
        self._loop = asyncio.new_event_loop()
        self._slots = asyncio.Semaphore(max_concurrency)
        self._queued: set[asyncio.Task[None]] = set()  # submitted, waiting for a slot
        self._tasks: set[asyncio.Task[None]] = set()  # submitted, not ended
        self._lock = threading.Lock()  # submit vs shutdown
        self._arrivals: list[tuple[asyncio.Future[Any], Future[Any]]] = []
        self._arrivals_lock = threading.Lock()
        self._waking = False  # a delivery of the arrivals is scheduled on the loop
        self._shut = False
        # Where the last env made said its steps run (None: no env has said yet).
        self._instant_start: bool | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="episodes", daemon=True)
        self._thread.start()
        if batcher is not None:
            batcher.add_settle_hook(self._wake)

    def submit(self, **episode_kwargs: Any) -> Future[Trajectory]:
        """Queue ``runner.episode(**episode_kwargs)``; the future of its ``Trajectory``."""
        return self.submit_all([episode_kwargs])[0]

    def submit_all(self, jobs: Iterable[Mapping[str, Any]]) -> list[Future[Trajectory]]:
        """``submit`` each of ``jobs`` (an episode's keyword arguments), all counted by the
        batcher before any starts: the first batch then waits for every one of them instead of
        closing on the few that started first."""
        started = [(dict(kwargs), Future()) for kwargs in jobs]
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot run episodes after shutdown")
            if self.batcher is not None:
                for _ in started:
                    self.batcher.join()
            self._loop.call_soon_threadsafe(self._start, started)
        return [future for _, future in started]

    def shutdown(self) -> None:
        with self._lock:
            if self._shut:
                return
            self._shut = True
        try:
            asyncio.run_coroutine_threadsafe(self._drain(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            if self.batcher is not None:
                self.batcher.remove_settle_hook(self._wake)
            self._loop.close()
            self._threads.shutdown(wait=True)

    # --- the loop's thread -------------------------------------------------------------------

    def _start(self, started: list[tuple[dict[str, Any], Future[Trajectory]]]) -> None:
        for kwargs, future in started:
            task = self._loop.create_task(self._episode(kwargs, future))
            self._queued.add(task)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        for task in self._queued:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _episode(self, kwargs: dict[str, Any], future: Future[Trajectory]) -> None:
        task = asyncio.current_task()
        try:
            async with self._slots:
                self._queued.discard(task)  # type: ignore[arg-type]
                if not future.set_running_or_notify_cancel():  # cancelled while queued
                    return
                try:
                    trajectory = await self._play(kwargs)
                except Exception as exc:  # a sink error, bad arguments: the caller's to see
                    future.set_exception(exc)
                else:
                    future.set_result(trajectory)
        except asyncio.CancelledError:  # shutdown while queued: never started
            future.cancel()
        finally:
            if self.batcher is not None:
                self.batcher.leave()

    async def _play(self, kwargs: dict[str, Any]) -> Trajectory:
        """Run one episode to its end; its env is closed on every path out."""
        steps = self.runner.episode(**kwargs)
        instant = self._instant_start
        action: Action | None = None
        error: Exception | None = None
        try:
            while True:
                call = _advance(steps, action, error)
                if instant:
                    need = call()
                elif instant is None:  # not told yet: waited for like any episode that will ask
                    need = await self._in_thread(call)
                else:
                    need = await self._away(call)
                if not isinstance(need, ActionNeeded):
                    return need
                instant = self._instant_start = need.instant_steps
                action, error = await self._act(need)
        finally:
            # A no-op once the episode returned; else (a sink error, a bug) it closes the env.
            if instant:
                steps.close()
            else:
                await self._in_thread(steps.close)

    async def _act(self, need: ActionNeeded) -> tuple[Action | None, Exception | None]:
        """The agent's action for ``need``, or what producing it raised (thrown into the
        episode where ``act`` would have raised it: a full context window, a dead engine)."""
        try:
            if self.batcher is None:
                act = self.agent.act
                action = await self._in_thread(
                    lambda: act(need.task, need.messages, episode_id=need.episode_id)
                )
                return action, None
            request = self.agent.request(need.messages, episode_id=need.episode_id)
            sent = now()
            completion = await self._arrival(self.batcher.submit(request))
            action = self.agent.action(
                completion, need.messages, episode_id=need.episode_id, started=sent
            )
            return action, None
        except Exception as exc:
            return None, exc

    def _arrival(self, pending: Future[Any]) -> asyncio.Future[Any]:
        """``pending`` (a batcher's future) as an awaitable on the loop. A batch's completions
        arrive together: they are queued as the engine's thread settles them, and the loop is
        woken once, when the whole batch is settled (``DynamicBatcher.add_settle_hook``), not
        once per episode as with ``asyncio.wrap_future``, where each wake-up hands the
        interpreter to the loop's thread while the engine's still has futures to settle."""
        arrived = self._loop.create_future()
        pending.add_done_callback(lambda done: self._arrive(arrived, done))
        return arrived

    def _arrive(self, arrived: asyncio.Future[Any], done: Future[Any]) -> None:
        if threading.get_ident() == self._thread.ident:  # settled before it was awaited
            _settle(arrived, done)
            return
        with self._arrivals_lock:
            self._arrivals.append((arrived, done))

    def _wake(self) -> None:
        """The batcher's settle hook (the engine's thread): deliver what arrived, if any."""
        with self._arrivals_lock:
            if not self._arrivals or self._waking:
                return
            self._waking = True
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._arrivals_lock:
            arrivals, self._arrivals = self._arrivals, []
            self._waking = False
        for arrived, done in arrivals:
            _settle(arrived, done)

    async def _away(self, call: Callable[[], Any]) -> Any:
        """An env call on the pool, during which the batcher does not wait for this episode."""
        if self.batcher is None:
            return await self._in_thread(call)
        self.batcher.away()
        try:
            return await self._in_thread(call)
        finally:
            self.batcher.back()

    async def _in_thread(self, call: Callable[[], Any]) -> Any:
        """``call()`` on the pool; awaited to its end even if this task is cancelled, since
        the episode's generator must not be touched while a thread runs it."""
        running = self._loop.run_in_executor(self._threads, call)
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await running
            raise


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


def _advance(
    steps: EpisodeSteps, action: Action | None, error: Exception | None
) -> Callable[[], ActionNeeded | Trajectory]:
    """The call that runs the episode to its next action (an ``ActionNeeded``) or its end (the
    ``Trajectory``; a ``StopIteration`` cannot cross a future)."""

    def call() -> ActionNeeded | Trajectory:
        try:
            return steps.throw(error) if error is not None else steps.send(action)  # type: ignore[arg-type]
        except StopIteration as stop:
            return stop.value

    return call
