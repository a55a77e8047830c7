"""The seam between a training mode and the run it drives: the typed protocols a mode's loop
calls (docs/design.md §4). ``thundersync.training.trainer.Trainer`` implements ``Run``; the
mode objects (``sync``, ``async_``, ``streaming``) implement ``Mode``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from thundersync.core.contract import LearnerContract
from thundersync.protocol import events as ev


class EventLearner(Protocol):
    """What a mode asks of a learner (``thundersync.Learner`` and ``DataParallelLearner``)."""

    def consume(self, event: ev.Event) -> None: ...

    def drain(self) -> None: ...

    def wake_after(self) -> float | None:
        """Seconds until work the learner holds back must run (None: it holds none)."""
        ...


@dataclass(frozen=True, slots=True)
class Arrivals:
    """A batch's events that arrived since the last look, and whether the batch is complete
    (every episode rewarded and, for OPD, every turn scored) with these taken."""

    events: list[ev.Event]
    is_complete: bool


class Run(Protocol):
    """The run a mode drives: rollout batches go out, events come back, steps are taken."""

    @property
    def learner(self) -> EventLearner: ...

    def steps(self) -> range:
        """The steps left to run (a resumed run starts after its last checkpoint)."""
        ...

    def submit(self, step: int) -> None:
        """Start rolling out batch ``step`` with whatever weights the engine has by then."""
        ...

    def wait_batch(self, step: int) -> list[ev.Event]:
        """Block until batch ``step`` is complete; its events not taken yet."""
        ...

    def arrivals(self, step: int, timeout_s: float | None = None) -> Arrivals:
        """Block until something arrives, or at most ``timeout_s`` (None: no limit but the
        run's worker timeout); batch ``step``'s events not taken yet (none when the time ran
        out)."""
        ...

    def finish_step(self, step: int) -> dict[str, Any]:
        """The optimizer step, new weights to the engine, checkpoint, metrics (returned)."""
        ...


class Mode(Protocol):
    """Everything that differs between the training modes; nothing outside the mode objects
    asks which mode runs."""

    @property
    def name(self) -> str:
        """The registered name (``TrainConfig.mode``, ``--mode``)."""
        ...

    @property
    def label(self) -> str:
        """The name with the mode's own settings (``async-k2``): a comparison's key."""
        ...

    @property
    def baseline(self) -> bool:
        """Whether speed-ups are measured against this mode (one mode is the baseline)."""
        ...

    @property
    def exact(self) -> bool:
        """Whether its update is the baseline's, exactly (so the bound T* applies)."""
        ...

    @property
    def label_forms(self) -> str:
        """The labels it takes, for a message (``async (with --staleness) or async-k<K>``)."""
        ...

    def train_fields(self) -> dict[str, Any]:
        """The ``TrainConfig`` fields that select this mode."""
        ...

    @property
    def batches_in_flight(self) -> int:
        """Rollout batches submitted and not yet stepped, at most (sizes the engine's
        concurrency)."""
        ...

    @property
    def starts_backward_before_step(self) -> bool:
        """Whether gradient work starts while the batch still rolls out (what ``early_start``
        moves earlier)."""
        ...

    def learner_contract(self) -> LearnerContract:
        """The mode's terms with the learner (every learner rank's too): when gradient work
        starts, which versions' tokens it takes, which objectives it trains, its strategy."""
        ...

    def learn(self, learner: EventLearner, events: Sequence[ev.Event]) -> None:
        """Hand ``events`` that arrived to ``learner``: the main run and every data-parallel
        rank call this for the events of the step they are in."""
        ...

    def run(self, run: Run) -> list[dict[str, Any]]:
        """The loop over the run's steps; returns each step's metrics."""
        ...
