"""Events: the public protocol between environments, workers and the learner (docs/design.md §2).

Every event is a frozen dataclass named ``<Subject><PastVerb>`` with keyword-only fields and a
``t`` timestamp in seconds on the run's clock. Token arrays are tuples of ints and log-probs
tuples of floats, exactly as the policy saw them. Fields may be added later; none is renamed.

``to_dict``/``from_dict`` round-trip an event losslessly (for worker processes);
``summarize`` is what ``events.jsonl`` holds: token arrays replaced by their lengths.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thundersync.protocol.strict_json import dumps_nulled

_EPOCH = time.monotonic()


def now() -> float:
    """Seconds on the run's clock (monotonic, from process start or the last ``reset_clock``)."""
    return time.monotonic() - _EPOCH


def reset_clock() -> None:
    """Start the run's clock at zero (called once when a run starts)."""
    global _EPOCH
    _EPOCH = time.monotonic()


def clock_epoch() -> float:
    """The run clock's zero as a ``time.monotonic()`` value (to hand to worker processes)."""
    return _EPOCH


def set_clock_epoch(epoch: float) -> None:
    """Share a run's clock: the monotonic clock is system-wide on Linux, so a worker process
    given its parent's ``clock_epoch()`` stamps events on the same timeline."""
    global _EPOCH
    _EPOCH = epoch


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event; ``t`` is seconds on the run's clock when it fired."""

    t: float = field(default_factory=now)


# --- rollout side ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeStarted(Event):
    """A task was reset: the prompt tokens are fixed."""

    episode_id: str
    group_id: str
    group_size: int
    task_id: str
    prompt_ids: tuple[int, ...]
    policy_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnCompleted(Event):
    """An action was sampled; fired *before* its tool call runs."""

    episode_id: str
    turn: int
    action_ids: tuple[int, ...]
    action_logprobs: tuple[float, ...]
    policy_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFinished(Event):
    """The sandbox returned the observation of ``turn``'s action."""

    episode_id: str
    turn: int
    observation_ids: tuple[int, ...]
    duration_s: float
    exit_code: int | None
    timed_out: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeCompleted(Event):
    """The last action is fixed: every token of the trajectory is known (grading may follow)."""

    episode_id: str
    num_turns: int
    stop_reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RewardReady(Event):
    """Grading finished. ``infra_failure`` marks a reward that must not be trained on."""

    episode_id: str
    reward: float
    infra_failure: bool = False
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeStepGraded(Event):
    """One step of a multi-step task (Harbor's ``[[steps]]``; ``step`` from 0) was graded, as
    soon as it was: before the next step's instruction is the observation, the last step's
    before ``RewardReady``. A record: the episode's reward (what is trained on) is
    ``RewardReady``'s, which holds every step's grade in ``details["steps"]``."""

    episode_id: str
    step: int
    reward: float
    infra_failure: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TeacherScored(Event):
    """The OPD teacher scored ``turn``'s action tokens."""

    episode_id: str
    turn: int
    teacher_logprobs: tuple[float, ...]


EpisodeEvent = (
    EpisodeStarted | TurnCompleted | ToolFinished | EpisodeCompleted | RewardReady | TeacherScored
)
"""An event of one episode (it names it: ``episode_id``), what an ``EpisodeRecord`` holds."""

EPISODE_EVENTS = (
    EpisodeStarted,
    TurnCompleted,
    ToolFinished,
    TeacherScored,
    EpisodeCompleted,
    RewardReady,
)
"""The ``EpisodeEvent`` classes, for ``isinstance``."""


# --- learner side ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class GradientComputed(Event):
    """The learner finished one piece of gradient work (``turn`` is None for a whole episode)."""

    episode_id: str
    turn: int | None
    started: float
    finished: float


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFinished(Event):
    """The optimizer stepped; ``policy_version`` is the new version."""

    step: int
    policy_version: int
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsSynced(Event):
    """The rollout engine now samples with ``policy_version``."""

    policy_version: int
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalFinished(Event):
    """A held-out evaluation finished."""

    step: int
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanRecorded(Event):
    """A worker did one piece of work from ``started`` to ``finished`` (run-clock seconds):
    ``name`` is one of generate (one request inside a batch), engine (one batched forward),
    tool, grading, teacher, backward, optimizer, step (the whole learner step), weight_publish,
    weight_sync, checkpoint. The raw material of step-time breakdowns and timelines (never fed
    to a learner).
    """

    name: str
    started: float
    finished: float
    worker: str
    step: int | None = None
    episode_id: str | None = None
    turn: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSaved(Event):
    """A checkpoint directory was written."""

    step: int
    path: str
    metrics: dict[str, Any] = field(default_factory=dict)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        EpisodeStarted,
        TurnCompleted,
        ToolFinished,
        EpisodeCompleted,
        RewardReady,
        EpisodeStepGraded,
        TeacherScored,
        GradientComputed,
        StepFinished,
        WeightsSynced,
        EvalFinished,
        CheckpointSaved,
        SpanRecorded,
    )
}


# --- serialisation ---------------------------------------------------------------------------


def to_dict(event: Event) -> dict[str, Any]:
    """A JSON-able dict that ``from_dict`` turns back into an equal event."""
    record: dict[str, Any] = {"event": type(event).__name__}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        record[f.name] = list(value) if isinstance(value, tuple) else value
    return record


def from_dict(record: dict[str, Any]) -> Event:
    """Rebuild an event from ``to_dict`` output; raises ValueError naming what is wrong."""
    name = record.get("event")
    cls = EVENT_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown event type {name!r}; expected one of {sorted(EVENT_TYPES)}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in record:
            continue
        value = record[f.name]
        kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"bad fields for {name}: {exc}") from exc


def summarize(event: Event) -> dict[str, Any]:
    """The ``events.jsonl`` form: token arrays become ``<name>_len`` lengths."""
    record: dict[str, Any] = {"event": type(event).__name__}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if isinstance(value, tuple):
            record[f"{f.name}_len"] = len(value)
        else:
            record[f.name] = value
    return record


# --- bus and sinks ---------------------------------------------------------------------------

Subscriber = Callable[[Event], None]


class EventBus:
    """In-process publish/subscribe; subscribers run synchronously, in subscription order.

    ``publish`` holds a lock, so events from several threads reach every subscriber in one
    total order.
    """

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []
        self._lock = threading.RLock()

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns a function that removes it."""
        with self._lock:
            self._subscribers.append(subscriber)

        def unsubscribe() -> None:
            with self._lock:
                if subscriber in self._subscribers:
                    self._subscribers.remove(subscriber)

        return unsubscribe

    def publish(self, event: Event) -> None:
        with self._lock:
            for subscriber in list(self._subscribers):
                subscriber(event)

    __call__ = publish


class JsonlSink:
    """Appends ``summarize(event)`` as one strict JSON line per event (a non-finite number is
    null, a ``Fraction`` or ``Decimal`` reward a float); flushes every line. ``lossless``:
    ``to_dict(event)`` instead, token ids and log-probs in full (``trajectories.jsonl``)."""

    def __init__(self, path: str | Path, *, lossless: bool = False) -> None:
        self.path = Path(path)
        self._record = to_dict if lossless else summarize
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        line = dumps_nulled(self._record(event))  # strict JSON: a non-finite number is null
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> JsonlSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read an ``events.jsonl`` file back as dicts (summaries, not events)."""
    records = []
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line: {exc}") from exc
    return records
