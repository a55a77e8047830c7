"""The messages the trainer sends its workers (docs/design.md §5), matched with ``match``.

To the rollout worker: ``RunBatch`` (play a batch), ``PrepareBatch`` (make a later batch's
envs ahead), ``LoadWeights`` (load the published weights between batches), ``Stop``. To a
data-parallel learner rank: ``Forwarded`` (an event of one of its groups), ``TakeStep``,
``Stop``. To the OPD teacher: events, then ``Stop``.

A worker's entry point says which messages its queues carry: ``Inbox[RolloutMessage]``,
``Inbox[RankMessage]``, ``Inbox[TeacherMessage]`` in, ``Outbox[...]`` out (a
``multiprocessing`` queue locally, a Ray queue on a cluster; both have these methods).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeKey


@dataclass(frozen=True, slots=True)
class RunBatch:
    """Play batch ``step``: ``num_tasks`` task groups of ``group_size`` episodes each."""

    step: int
    num_tasks: int
    group_size: int

    def episodes(self) -> list[EpisodeKey]:
        return EpisodeKey.batch(self.step, self.num_tasks, self.group_size)


@dataclass(frozen=True, slots=True)
class PrepareBatch:
    """Make and reset ``batch``'s envs ahead (its sandboxes started, its tasks set up), once
    no episode plays: while the learner trains the step before, off the engine's path. Its
    ``RunBatch`` then plays in them (``EpisodeDriver.prepare_all``)."""

    batch: RunBatch


@dataclass(frozen=True, slots=True)
class LoadWeights:
    """Load the weights the trainer just published; ``payload`` is what the weight
    backend's ``publish`` returned (a version and where the tensors are)."""

    payload: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Forwarded:
    """An event of one of the rank's episodes."""

    event: ev.EpisodeEvent


@dataclass(frozen=True, slots=True)
class TakeStep:
    """Every event of batch ``step`` was forwarded: take the step with the other ranks."""

    step: int


@dataclass(frozen=True, slots=True)
class Stop:
    """Finish: the worker returns (after closing what it holds)."""


RolloutMessage = LoadWeights | RunBatch | PrepareBatch | Stop
"""What the rollout worker receives."""

RankMessage = Forwarded | TakeStep | Stop
"""What a data-parallel learner rank (≥ 1) receives."""

TeacherMessage = ev.EpisodeStarted | ev.TurnCompleted | ev.ToolFinished | ev.EpisodeCompleted | Stop
"""What the OPD teacher receives: the token events of each episode, then ``Stop``."""

_Received = TypeVar("_Received", covariant=True)
_Sent = TypeVar("_Sent", contravariant=True)


class Inbox(Protocol[_Received]):
    """The end of a queue a worker reads its messages from."""

    def get(self) -> _Received: ...

    def get_nowait(self) -> _Received: ...


class Outbox(Protocol[_Sent]):
    """The end of a queue a worker writes to."""

    def put(self, item: _Sent, /) -> None: ...


_Message = TypeVar("_Message")


class Channel(Inbox[_Message], Outbox[_Message], Protocol[_Message]):
    """A whole queue: one process puts, another gets."""
