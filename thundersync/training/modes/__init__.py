"""Training modes, one object in one file each (docs/design.md §4): ``SyncMode``,
``AsyncMode`` (bounded staleness) and ``StreamingMode`` (exact, zero staleness), over the
protocols of ``modes.run``. ``REGISTRY`` lists them; the command line, ``compare``, its report
and the benchmarks take names, labels and roles (the baseline, the exact modes) from the mode
objects, so a fourth mode is one file and one line here."""

from __future__ import annotations

from thundersync.training.modes.async_ import AsyncMode
from thundersync.training.modes.run import Arrivals, EventLearner, Mode, Run
from thundersync.training.modes.streaming import StreamingMode
from thundersync.training.modes.sync import SyncMode

__all__ = [
    "REGISTRY",
    "Arrivals",
    "AsyncMode",
    "EventLearner",
    "Mode",
    "Run",
    "StreamingMode",
    "SyncMode",
    "baseline_mode",
    "choose_mode",
    "mode_from_label",
]

REGISTRY = (SyncMode, AsyncMode, StreamingMode)
"""Every mode class, in the order they are listed (``compare``'s default ``--modes``)."""


def choose_mode(name: str, *, staleness: int) -> Mode:
    """The mode object named ``name`` (``TrainConfig.mode``); ``staleness`` is async's k."""
    mode = next(
        (cls.from_label(name, staleness=staleness) for cls in REGISTRY if cls.name == name), None
    )
    if mode is None:
        raise ValueError(
            f"unknown mode {name!r}; expected one of {sorted(c.name for c in REGISTRY)}"
        )
    return mode


def mode_from_label(label: str, *, staleness: int) -> Mode:
    """The mode a label names: a registered name (async with ``staleness``) or a label with
    the mode's own settings (``async-k2``)."""
    for cls in REGISTRY:
        mode = cls.from_label(label, staleness=staleness)
        if mode is not None:
            return mode
    forms = ", ".join(cls.label_forms for cls in REGISTRY)
    raise ValueError(f"mode {label!r}: expected {forms}")


def baseline_mode() -> Mode:
    """The mode speed-ups are measured against."""
    baseline = next(cls for cls in REGISTRY if cls.baseline)
    mode = baseline.from_label(baseline.name, staleness=1)
    if mode is None:
        raise ValueError(f"mode {baseline.name!r}: its own name is not one of its labels")
    return mode
