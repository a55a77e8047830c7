"""Training modes, one object in one file each (docs/design.md §4): ``SyncMode``,
``AsyncMode`` (bounded staleness) and ``StreamingMode`` (exact, zero staleness), over the
protocols of ``modes.protocol``. ``choose_mode`` is the one place a mode's name is read."""

from __future__ import annotations

from thundersync.training.modes.async_ import AsyncMode
from thundersync.training.modes.run import Arrivals, EventLearner, Mode, Run
from thundersync.training.modes.streaming import StreamingMode
from thundersync.training.modes.sync import SyncMode

__all__ = [
    "Arrivals",
    "AsyncMode",
    "EventLearner",
    "Mode",
    "Run",
    "StreamingMode",
    "SyncMode",
    "choose_mode",
]


def choose_mode(name: str, *, staleness: int) -> Mode:
    """The mode object named ``name`` (``TrainConfig.mode``); ``staleness`` is async's k."""
    modes: dict[str, Mode] = {
        "sync": SyncMode(),
        "async": AsyncMode(staleness),
        "streaming": StreamingMode(),
    }
    if name not in modes:
        raise ValueError(f"unknown mode {name!r}; expected one of {sorted(modes)}")
    return modes[name]
