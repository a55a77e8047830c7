"""How the rollout worker and evaluation drive episodes: on one thread (``InlineEpisodes``)
for envs whose steps answer at once, else a thread each (``EpisodeThreads``);
``episode_driver`` picks.

The rollout worker runs each episode on a thread of its own, which is what envs whose tools
and graders block (a sandboxed command, a test suite) need. With in-process tools that answer at
once (``environments.core.INSTANT_STEPS``) a turn is a fraction of a millisecond of Python
between two engine batches, and on threads each turn also costs the interpreter changing hands
between them, a wake-up of about 0.1 ms on a small VM: the engine then waits on the loop about
twice as long as the loop's Python takes (``benchmarks/training_modes.py``, docs/design.md §5).

``InlineEpisodes`` runs the same episodes (``EpisodeRunner.episode``: the same events, failures
and cancellation as ``run_episode``) as generators on one thread: each parked where its
action is due, its engine request submitted to the ``DynamicBatcher`` without waiting; when a
batch's completions arrive, every episode of it is resumed in turn, runs its tool and reward
inline, and parks again at its next request. The interpreter changes hands twice per batch
instead of once per episode and turn. Every env call runs on the driver's thread, so a slow
one delays every episode: only for envs that declare ``INSTANT_STEPS``.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from environments.core import INSTANT_STEPS
from environments.runner import ActionNeeded, EpisodeRunner, EpisodeSteps
from thundersync.events import now
from thundersync.training.agent import PolicyAgent
from thundersync.training.engines.batcher import DynamicBatcher


@dataclass(slots=True)
class _Job:
    kwargs: dict[str, Any]
    future: Future = field(default_factory=Future)
    steps: EpisodeSteps | None = None
    need: ActionNeeded | None = None
    sent: float = 0.0


class InlineEpisodes:
    """Runs ``runner``'s episodes on one thread over ``batcher``, at most ``max_concurrency``
    at once; ``runner.agent`` is a ``PolicyAgent`` whose requests this submits to ``batcher``
    itself (``request``, then ``action`` on the completion). ``submit`` is a thread pool's, its
    future the episode's ``Trajectory`` (or the ``SinkError`` that escaped it). The batcher
    counts each episode from its ``submit`` until it ends (``join``/``leave``), so that a batch
    holding every live episode's request runs at once.
    ``shutdown`` cancels what has not started and waits for the rest to end (after
    ``runner.cancel``, at once)."""

    def __init__(
        self, runner: EpisodeRunner, batcher: DynamicBatcher, *, max_concurrency: int
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.runner = runner
        self.agent: PolicyAgent = runner.agent  # type: ignore[assignment]
        self.batcher = batcher
        self.max_concurrency = max_concurrency
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._jobs: dict[int, _Job] = {}  # submitted and not ended (the driver's failsafe)
        self._lock = threading.Lock()  # submit vs shutdown and the failsafe
        self._shut = False
        self._thread = threading.Thread(target=self._run, name="episodes", daemon=True)
        self._thread.start()

    def submit(self, **episode_kwargs: Any) -> Future:
        """Queue ``runner.episode(**episode_kwargs)``; the future of its ``Trajectory``."""
        job = _Job(episode_kwargs)
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot run episodes after shutdown")
            self.batcher.join()
            self._jobs[id(job)] = job
            self._inbox.put(("start", job))
        return job.future

    def shutdown(self) -> None:
        with self._lock:
            self._shut = True
            self._inbox.put(("stop",))
        self._thread.join()

    # --- the driver's thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug here must not leave an episode's caller waiting
            with self._lock:
                self._shut = True
                jobs, self._jobs = list(self._jobs.values()), {}
            for job in jobs:
                if job.steps is not None:
                    with contextlib.suppress(BaseException):
                        job.steps.close()  # closes its env
                self.batcher.leave()
                if not job.future.done():
                    job.future.set_exception(RuntimeError(f"the episode driver failed: {exc!r}"))
            raise

    def _loop(self) -> None:
        queued: deque[_Job] = deque()
        live = 0
        stopping = False
        while not (stopping and live == 0):
            items = [self._inbox.get()]
            while True:  # a batch's completions arrive together: resume them all in one go
                try:
                    items.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for kind, *payload in items:
                if kind == "start":
                    queued.append(payload[0])
                elif kind == "done":
                    live -= self._resume(*payload)
                else:
                    stopping = True
            if stopping:
                for job in queued:
                    job.future.cancel()
                    self._forget(job)
                queued.clear()
            while queued and live < self.max_concurrency:
                job = queued.popleft()
                if not job.future.set_running_or_notify_cancel():
                    self._forget(job)
                    continue
                try:
                    job.steps = self.runner.episode(**job.kwargs)
                except Exception as exc:  # arguments the runner does not take
                    self._end(job, None, exc)
                    continue
                live += 1 - self._advance(job, None, None)

    def _resume(self, job: _Job, completion: Future, finished: float) -> bool:
        """Resume ``job`` with its engine's answer (arrived at ``finished``); whether the
        episode ended."""
        need = job.need
        assert need is not None
        error: BaseException | None = None
        try:
            action = self.agent.action(
                completion.result(),
                need.messages,
                episode_id=need.episode_id,
                started=job.sent,
                finished=finished,
            )
        except BaseException as exc:  # the engine failed or was closed: the episode's to handle
            action, error = None, exc
        return self._advance(job, action, error)  # thrown outside the handler: no stale context

    def _advance(self, job: _Job, action: Any, error: BaseException | None) -> bool:
        """Run the episode to its next action (submitted to the engine) or its end; whether it
        ended."""
        assert job.steps is not None
        while True:
            try:
                job.need = job.steps.throw(error) if error is not None else job.steps.send(action)
            except StopIteration as stop:
                return self._end(job, stop.value, None)
            except BaseException as exc:  # a sink error: it stops the run, as on a thread
                return self._end(job, None, exc)
            try:
                request = self.agent.request(job.need.messages, episode_id=job.need.episode_id)
                job.sent = now()
                pending = self.batcher.submit(request)
            except BaseException as exc:  # a full context window, a closed engine
                action, error = None, exc
                continue
            pending.add_done_callback(
                lambda done, job=job: self._inbox.put(("done", job, done, now()))
            )
            return False

    def _end(self, job: _Job, trajectory: Any, error: BaseException | None) -> bool:
        self._forget(job)
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(trajectory)
        return True

    def _forget(self, job: _Job) -> None:
        """``job`` ended or never started: uncount it."""
        with self._lock:
            self._jobs.pop(id(job), None)
        self.batcher.leave()


class EpisodeThreads:
    """Each episode on a thread of its own (envs whose tools or graders block); ``submit`` and
    ``shutdown`` as ``InlineEpisodes``'s."""

    def __init__(self, runner: Any, batcher: Any, max_concurrency: int) -> None:
        self.runner, self.batcher = runner, batcher
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="episode")

    def submit(self, **episode_kwargs: Any) -> Future:
        self.batcher.join()
        try:
            return self.pool.submit(
                _counted, self.batcher, self.runner.run_episode, **episode_kwargs
            )
        except BaseException:  # after shutdown: never counted out by its thread
            self.batcher.leave()
            raise

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def episode_driver(
    runner: EpisodeRunner,
    batcher: DynamicBatcher,
    make_env: Callable[[], Any],
    max_concurrency: int,
) -> InlineEpisodes | EpisodeThreads:
    """``InlineEpisodes`` (one thread) for an env that declares ``INSTANT_STEPS``, else
    ``EpisodeThreads``. ``make_env`` makes the env to ask (closed, never reset)."""
    env = make_env()
    try:
        instant = bool(env.metadata.get(INSTANT_STEPS))
    finally:
        env.close()
    if instant:
        return InlineEpisodes(runner, batcher, max_concurrency=max_concurrency)
    return EpisodeThreads(runner, batcher, max_concurrency)


def _counted(batcher: Any, play: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return play(*args, **kwargs)
    finally:
        batcher.leave()
