"""Training modes, one file each, readable top to bottom (docs/design.md §4):
``sync``, ``async_`` (bounded staleness) and ``streaming`` (exact, zero staleness)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def mode_runner(mode: str) -> Callable[[Any], list[dict[str, Any]]]:
    """The ``run(trainer)`` function of ``mode`` (sync, async or streaming)."""
    from thundersync.training.modes import async_, streaming, sync

    runners = {"sync": sync.run, "async": async_.run, "streaming": streaming.run}
    if mode not in runners:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(runners)}")
    return runners[mode]
