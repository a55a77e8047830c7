"""``EpisodeDriver``: how the rollout worker, evaluation and the benchmark play episodes, as
coroutines on one asyncio loop.

Each episode is the runner's generator (``EpisodeRunner.episode``: the same events, failures
and cancellation as ``run_episode``) advanced by a coroutine. An action awaits the engine's
batched completion (``PolicyAgent.request``, the ``DynamicBatcher``'s future, then
``PolicyAgent.action``), so every live episode's request waits in the same batch and no thread
is parked per episode. An env call that may block (making a sandbox, a sandboxed command, a
grader) runs on at most ``max_concurrency`` threads (``ThreadHops``: a put on a queue they
take from, the results delivered to the loop in one wake-up), and the batcher does not wait
for the episode meanwhile (``DynamicBatcher.away``: its next request comes only after the
call). An env that declares that its steps answer at once (``environments.core.INSTANT_STEPS``,
carried by ``ActionNeeded.instant_steps``) is stepped on the loop itself: a thread hop per turn
costs the interpreter changing hands twice, which is most of what the engine would wait for
between two batches (docs/design.md §5). An episode's first call (making and resetting its
env) runs where the previous episode's env said its steps run: a runner's envs all come from
one ``make_env``, and resets that hop to threads all at once reach the batcher staggered,
splitting the first batch. Until some env has said, a first call runs on the pool without the
episode counted away, so the first batch still waits for every episode.
An ``asyncio.Semaphore`` bounds the episodes live at once (``max_concurrency``).

``prepare_all`` makes and resets the envs of episodes to be submitted later, once no episode
plays (``training/preparations.py``); such an episode's first call runs on the loop, since
nothing in it blocks.

Without a batcher (agents that need no engine: the oracle, scripted agents) each action is the
agent's ``act``, on the pool of threads, since an agent may block.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from environments.agents import Action
from environments.episode_steps import ActionNeeded, EpisodeSteps
from environments.runner import EpisodeRunner
from thundersync.protocol.events import now
from thundersync.protocol.types import Trajectory
from thundersync.training.arrivals import BatchArrivals
from thundersync.training.engines.batcher import DynamicBatcher
from thundersync.training.hops import ThreadHops
from thundersync.training.preparations import Preparation, Preparations


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
        max_prepared: int | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.runner = runner
        self.agent: Any = runner.agent
        self.batcher = batcher
        self.max_concurrency = max_concurrency
        self._loop = asyncio.new_event_loop()
        # One thread per live episode at most: an episode runs one env call or action at a time.
        self._hops = ThreadHops(self._loop, max_concurrency, name="episode")
        self._slots = asyncio.Semaphore(max_concurrency)
        self._queued: set[asyncio.Task[None]] = set()  # submitted, waiting for a slot
        self._tasks: set[asyncio.Task[None]] = set()  # submitted, not ended
        self._lock = threading.Lock()  # submit vs shutdown
        self._live = 0  # episodes submitted and not ended (loop thread)
        self._shut = False
        # Where the last env made said its steps run (None: no env has said yet).
        self._instant_start: bool | None = None
        self._preparations = Preparations(
            runner,
            batcher,
            spawn=self._spawn,
            in_thread=self._in_thread,
            instant=lambda: self._instant_start,
            limit=max_prepared,
        )
        self._thread = threading.Thread(target=self._loop.run_forever, name="episodes", daemon=True)
        self._arrivals = BatchArrivals(self._loop, self._thread)
        self._thread.start()
        if batcher is not None:
            batcher.add_settle_hook(self._arrivals.wake)

    def submit(self, **episode_kwargs: Any) -> Future[Trajectory]:
        """Queue ``runner.episode(**episode_kwargs)``; the future of its ``Trajectory``."""
        return self.submit_all([episode_kwargs])[0]

    def submit_all(self, jobs: Iterable[Mapping[str, Any]]) -> list[Future[Trajectory]]:
        """``submit`` each of ``jobs`` (an episode's keyword arguments), all counted by the
        batcher before any starts: the first batch then waits for every one of them instead of
        closing on the few that started first."""
        started = [(dict(kwargs), Future[Trajectory]()) for kwargs in jobs]
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot run episodes after shutdown")
            if self.batcher is not None:
                for _ in started:
                    self.batcher.join()
            self._loop.call_soon_threadsafe(self._start, started)
        return [future for _, future in started]

    def prepare_all(self, jobs: Iterable[Mapping[str, Any]]) -> list[Future[None]]:
        """Prepare ``jobs`` (episodes' keyword arguments, each with its ``episode_id``) ahead
        of their ``submit``: their envs are made and reset as soon as no episode plays (see
        the module docstring). A preparation replaces an earlier one of the same episode;
        those never submitted are discarded (their envs closed) at ``shutdown``. At most
        ``max_prepared`` are kept waiting at once (an env whose server allows so many sessions:
        each prepared env holds one until its episode plays); the rest make their envs when
        they play. Returns, for each, a future done when its env is made (cancelled if it
        never starts)."""
        preparations = [Preparation(kwargs) for kwargs in jobs]
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot prepare episodes after shutdown")
            self._loop.call_soon_threadsafe(self._prepare, preparations)
        return [preparation.made for preparation in preparations]

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
                self.batcher.remove_settle_hook(self._arrivals.wake)
            self._loop.close()
            self._hops.shutdown()

    # --- the loop's thread -------------------------------------------------------------------

    def _start(self, started: list[tuple[dict[str, Any], Future[Trajectory]]]) -> None:
        for kwargs, future in started:
            self._live += 1
            task = self._loop.create_task(self._episode(kwargs, future))
            self._queued.add(task)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        for task in self._queued:
            task.cancel()
        self._preparations.discard_all()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _prepare(self, preparations: list[Preparation]) -> None:
        self._preparations.add(preparations)
        if not self._live:  # else once the live episodes have ended: they would slow them
            self._preparations.start()

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A task of the driver's (``shutdown`` waits for it)."""
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _episode(self, kwargs: dict[str, Any], future: Future[Trajectory]) -> None:
        task = asyncio.current_task()
        try:
            async with self._slots:
                self._queued.discard(task)
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
            self._live -= 1
            if not self._live:
                self._preparations.start()

    async def _play(self, kwargs: dict[str, Any]) -> Trajectory:
        """Run one episode to its end; its env is closed on every path out."""
        prepared = await self._preparations.take(kwargs)
        if prepared is None:
            steps = self.runner.episode(**kwargs)
            instant = self._instant_start
        else:  # its first call blocks on nothing: its env was made and reset
            steps = self.runner.episode(prepared=prepared)
            instant = True
        action: Action | None = None
        error: Exception | None = None
        counted = False  # the batcher counts the episode away already (``_act``)
        try:
            while True:
                call = _advance(steps, action, error)
                if instant:
                    need = call()
                elif instant is None:  # not told yet: waited for like any episode that will ask
                    need = await self._in_thread(call)
                else:
                    need, counted = await self._away(call, counted), False
                if not isinstance(need, ActionNeeded):
                    return need
                instant = self._instant_start = need.instant_steps
                action, error, counted = await self._act(need, then_away=not instant)
        finally:
            # A no-op once the episode returned; else (a sink error, a bug) it closes the env.
            if instant:
                steps.close()
            else:
                await self._in_thread(steps.close)

    async def _act(
        self, need: ActionNeeded, *, then_away: bool
    ) -> tuple[Action | None, Exception | None, bool]:
        """The agent's action for ``need``, or what producing it raised (thrown into the
        episode where ``act`` would have raised it: a full context window, a dead engine);
        and whether the batcher now counts the episode away: its request was submitted
        ``then_away`` (its next call is a tool's, so a batch gathering while it gets there
        does not wait for it) and was settled."""
        if self.batcher is None:
            act = self.agent.act
            try:
                action = await self._in_thread(
                    lambda: act(need.task, need.messages, episode_id=need.episode_id)
                )
            except Exception as exc:
                return None, exc, False
            return action, None, False
        try:
            request = self.agent.request(need.messages, episode_id=need.episode_id)
            sent = now()
            pending = self.batcher.submit(request, then_away=then_away)
        except Exception as exc:
            return None, exc, False
        try:
            completion = await self._arrivals.awaitable(pending)
            action = self.agent.action(
                completion, need.messages, episode_id=need.episode_id, started=sent
            )
        except Exception as exc:
            return None, exc, then_away
        return action, None, then_away

    async def _away(self, call: Callable[[], Any], counted: bool = False) -> Any:
        """An env call on the pool, during which the batcher does not wait for this episode
        (``counted``: it counts it away already)."""
        if self.batcher is None:
            return await self._in_thread(call)
        if not counted:
            self.batcher.away()
        try:
            return await self._in_thread(call)
        finally:
            self.batcher.back()

    async def _in_thread(self, call: Callable[[], Any]) -> Any:
        """``call()`` on the pool; awaited to its end even if this task is cancelled, since
        the episode's generator must not be touched while a thread runs it."""
        return await self._hops.run(call)


def _advance(
    steps: EpisodeSteps, action: Action | None, error: Exception | None
) -> Callable[[], ActionNeeded | Trajectory]:
    """The call that runs the episode to its next action (an ``ActionNeeded``) or its end (the
    ``Trajectory``; a ``StopIteration`` cannot cross a future)."""

    def call() -> ActionNeeded | Trajectory:
        try:
            if error is not None:
                return steps.throw(error)
            return steps.send(action) if action is not None else next(steps)  # next: the start
        except StopIteration as stop:
            return stop.value

    return call
