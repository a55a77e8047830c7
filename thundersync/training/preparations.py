"""Episodes prepared ahead of their submission (``EpisodeDriver.prepare_all``).

The rollout worker has the next step's envs made and reset while the learner trains
(``PrepareBatch``): making sandboxes and setting up tasks then happens off the engine's path,
and the step's first batch holds every episode at once (docs/design.md §5). ``Preparations``
keeps them on the driver's loop: a preparation waits until the driver says that no episode
plays, then runs ``EpisodeRunner.prepare`` (on the pool, or on the loop for envs that
declare instant steps); a submitted episode takes its own, if it has ended or is under way,
and makes its env itself otherwise. What is never played is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import Future
from typing import Any

from environments.runner import EpisodeRunner, PreparedEpisode
from environments.sandboxes.protocol import SandboxError
from thundersync.training.engines.batcher import DynamicBatcher


class Preparation:
    """One episode prepared ahead: its arguments, the task making its env (None until it
    starts) and ``made``, the future its caller sees (cancelled if it never starts)."""

    __slots__ = ("kwargs", "made", "task")

    def __init__(self, kwargs: Mapping[str, Any]) -> None:
        if "episode_id" not in kwargs:
            raise ValueError("an episode prepared ahead needs its episode_id")
        self.kwargs = dict(kwargs)
        self.task: asyncio.Task[PreparedEpisode] | None = None
        self.made: Future[None] = Future()

    @property
    def episode_id(self) -> str:
        return self.kwargs["episode_id"]


class Preparations:
    """The driver's preparations, by episode id; every method runs on the driver's loop.
    ``spawn`` starts a coroutine as a task the driver waits for at shutdown; ``in_thread``
    runs a call on the driver's pool; ``instant`` says whether the envs' steps answer at once
    (None: not known yet); ``limit``: the most kept at once (None: no limit)."""

    def __init__(
        self,
        runner: EpisodeRunner,
        batcher: DynamicBatcher | None,
        *,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        in_thread: Callable[[Callable[[], Any]], Awaitable[Any]],
        instant: Callable[[], bool | None],
        limit: int | None = None,
    ) -> None:
        self._limit = limit
        self._runner = runner
        self._batcher = batcher
        self._spawn = spawn
        self._in_thread = in_thread
        self._instant = instant
        self._by_id: dict[str, Preparation] = {}

    def add(self, preparations: list[Preparation]) -> None:
        """Keep ``preparations``, each replacing an earlier one of its episode, up to ``limit``
        kept at once: one past it is cancelled (its episode makes its own env when it plays),
        since a prepared env holds what the limit counts (a server's session) until then."""
        for preparation in preparations:
            earlier = self._by_id.pop(preparation.episode_id, None)
            if earlier is not None:
                self._discard(earlier)
            if self._limit is not None and len(self._by_id) >= self._limit:
                preparation.made.cancel()
                continue
            self._by_id[preparation.episode_id] = preparation

    def start(self) -> None:
        """Start the preparations waiting (the driver calls it when no episode plays)."""
        for preparation in self._by_id.values():
            if preparation.task is None:
                preparation.task = self._spawn(self._prepare(preparation))

    async def take(self, kwargs: Mapping[str, Any]) -> PreparedEpisode | None:
        """The submitted episode's preparation, once it ended (the batcher not waiting for the
        episode meanwhile); None when it has none, or one not started or of other arguments
        (discarded): it makes its own env."""
        preparation = self._by_id.pop(kwargs.get("episode_id", ""), None)
        if preparation is None:
            return None
        if preparation.task is None or not _same_episode(preparation.kwargs, kwargs):
            self._discard(preparation)
            return None
        if preparation.task.done():
            return preparation.task.result()
        if self._batcher is not None:
            self._batcher.away()
        try:
            return await asyncio.shield(preparation.task)
        finally:
            if self._batcher is not None:
                self._batcher.back()

    def discard_all(self) -> None:
        """Close every preparation not taken (at shutdown)."""
        for preparation in self._by_id.values():
            self._discard(preparation)
        self._by_id.clear()

    async def _prepare(self, preparation: Preparation) -> PreparedEpisode:
        prepare = functools.partial(self._runner.prepare, **preparation.kwargs)
        try:
            return prepare() if self._instant() else await self._in_thread(prepare)
        finally:
            preparation.made.set_result(None)

    def _discard(self, preparation: Preparation) -> None:
        """Close the env of a preparation that will not play, once it is made."""
        if preparation.task is None:
            preparation.made.cancel()
            return
        made = preparation.task

        async def discard() -> None:
            with contextlib.suppress(Exception):
                prepared = await made
                # a sandbox that cannot be removed is left to the orphan reaper
                with contextlib.suppress(SandboxError):
                    await self._in_thread(functools.partial(self._runner.discard, prepared))

        self._spawn(discard())


def _same_episode(prepared: Mapping[str, Any], submitted: Mapping[str, Any]) -> bool:
    """Whether a preparation's arguments are the submitted episode's (its task by id: the
    worker draws the task again for the submission)."""

    def key(kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        task = kwargs.get("task")
        rest = sorted((name, value) for name, value in kwargs.items() if name != "task")
        return (None if task is None else task.task_id, rest)

    return key(prepared) == key(submitted)
