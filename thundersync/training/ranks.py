"""Data-parallel learner ranks 1 … N−1 (``--learner-ranks N``): the worker each rank runs
(``rank_main``) and rank 0's side of them (``Ranks``), docs/design.md §5.

The trainer (rank 0) forwards every episode event to the rank that owns the episode's group
(``stable_rank``) and keeps its own. Each rank hands the events of the step it is in to the
mode (``Mode.learn``: streaming computes their gradient work as they arrive, sync and async
at the step), and the step is one small gather plus one all-reduce, so every rank ends the
step with the same parameters; only rank 0 publishes weights and writes checkpoints.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thundersync.core.data_parallel import stable_rank
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeKey, step_of
from thundersync.training.control import Forwarded, Inbox, Outbox, RankMessage, Stop, TakeStep
from thundersync.training.learner_setup import LearnerSpec, build_learner, leave_process_group
from thundersync.training.telemetry import backward_span

if TYPE_CHECKING:  # a rank's process need not import the rollout worker's modules
    from thundersync.training.worker_pool import WorkerPool


@dataclass(frozen=True, slots=True)
class RankReady:
    """Rank ``rank`` loaded its replica and is about to join the process group."""

    rank: int


@dataclass(frozen=True, slots=True)
class RankStepped:
    """Rank ``rank`` took step ``step``: its own metrics and its backward spans of the step
    (sent together, so that rank 0 counts them in the step they belong to)."""

    rank: int
    step: int
    metrics: dict[str, Any]
    spans: list[ev.SpanRecorded]


def owner_of(key: EpisodeKey, world_size: int) -> int:
    """The rank that trains the episode's group."""
    return stable_rank(key.group_id, world_size)


class Ranks:
    """Rank 0's side: the other ranks started in the pool, the events of their groups
    forwarded, a step announced, their ``RankStepped`` reports gathered. With one rank: none,
    and every method does nothing."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._inboxes: list[Any] = []
        self._stepped: dict[int, dict[int, RankStepped]] = {}
        self._ready: set[int] = set()

    def start(self, pool: WorkerPool, spec: LearnerSpec) -> None:
        """Start ranks 1 … N−1 in ``pool`` (``stop`` reaches every one started)."""
        for rank in range(1, self.world_size):
            self._inboxes.append(pool.queue())
            pool.spawn(
                f"learner-{rank}",
                rank_main,
                spec,
                rank,
                self._inboxes[-1],
                pool.inbox,
                num_threads=spec.config.learner_threads,
            )

    def __bool__(self) -> bool:
        return bool(self._inboxes)

    def await_loaded(self, pool: WorkerPool) -> None:
        """Wait until every other rank has loaded its replica (``RankReady``) before joining
        the process group: a rank that fails to start is then a clear error, not a wait in
        ``init_process_group`` until its timeout."""
        while len(self._ready) < self.world_size - 1:
            pool.receive(self._route_loaded)

    def _route_loaded(self, item: ev.Event | RankReady | RankStepped) -> None:
        if isinstance(item, RankReady):
            self._ready.add(item.rank)

    def forward(self, event: ev.EpisodeEvent, key: EpisodeKey) -> None:
        """Send ``event`` (of episode ``key``) to the rank that trains its group."""
        owner = owner_of(key, self.world_size)
        if owner:  # rank 0 (the trainer) keeps its own
            self._inboxes[owner - 1].put(Forwarded(event))

    def step(self, step: int) -> None:
        """Every event of batch ``step`` was forwarded: the ranks take the step."""
        for inbox in self._inboxes:
            inbox.put(TakeStep(step))

    def stepped(self, report: RankStepped) -> None:
        self._stepped.setdefault(report.step, {})[report.rank] = report

    def reports(
        self, step: int, pool: WorkerPool, route: Callable[[Any], None]
    ) -> list[RankStepped]:
        """The other ranks' reports of ``step``, by rank (receiving until all are in)."""
        while len(self._stepped.get(step, {})) < self.world_size - 1:
            pool.receive(route)
        stepped = self._stepped.pop(step)
        return [stepped[rank] for rank in sorted(stepped)]

    def stop(self) -> None:
        for inbox in self._inboxes:
            getattr(inbox, "cancel_join_thread", lambda: None)()  # a dead rank's pipe
        for inbox in self._inboxes:
            inbox.put(Stop())


def rank_main(
    spec: LearnerSpec, rank: int, inbox: Inbox[RankMessage], output: Outbox[RankReady | RankStepped]
) -> None:
    """Rank ``rank`` ≥ 1 (a worker process): hand the events the trainer forwards to the
    mode, step when told, until ``Stop`` arrives.

    Messages (``training/control.py``): ``Forwarded(event)`` — an event of one of this rank's
    episodes; ``TakeStep(n)`` — every event of batch n was sent: take the step with the
    others. Events of later batches (async) wait until the batches before them are stepped."""

    spans: list[ev.SpanRecorded] = []

    def publish(event: ev.Event) -> None:
        if isinstance(event, ev.GradientComputed):
            spans.append(backward_span(event, f"learner-{rank}"))

    mode = spec.config.training_mode()
    built = build_learner(
        spec, rank=rank, publish=publish, loaded=lambda: output.put(RankReady(rank))
    )
    learner, current = built.learner, built.start_step
    now: list[ev.Event] = []
    later: dict[int | None, list[ev.Event]] = {}
    try:
        while True:
            for message in _waiting(inbox):
                match message:
                    case Stop():
                        return
                    case TakeStep(step):
                        mode.learn(learner, now)
                        metrics = learner.step()
                        output.put(RankStepped(rank, step, metrics, list(spans)))
                        spans.clear()
                        current, now = step + 1, later.pop(step + 1, [])
                    case Forwarded(event) if step_of(event.episode_id) == current:
                        now.append(event)
                    case Forwarded(event):
                        later.setdefault(step_of(event.episode_id), []).append(event)
            mode.learn(learner, now)  # what arrived: streaming computes it now
            now = []
    finally:
        leave_process_group()


def _waiting(inbox: Inbox[RankMessage]) -> list[RankMessage]:
    """The next message (blocking) and every one queued behind it."""
    messages = [inbox.get()]
    while not isinstance(messages[-1], Stop):
        try:
            messages.append(inbox.get_nowait())
        except queue.Empty:
            break
    return messages
