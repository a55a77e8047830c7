"""The runner's episode values: an episode while it runs (``EpisodeState``), one prepared ahead
(``PreparedEpisode``), the errors that end runs, and a terminal step's outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from environments.tasks import Grade, Task
from thundersync.protocol.episode import EpisodeRecord
from thundersync.protocol.types import StopReason


@dataclass(slots=True)
class EpisodeState:
    """One running episode (the runner's): who it is before ``EpisodeStarted``
    says so, and the ``record`` of every event it published."""

    episode_id: str
    group_id: str
    group_size: int
    task_id: str = ""
    prompt_ids: tuple[int, ...] = ()
    record: EpisodeRecord = field(init=False)

    def __post_init__(self) -> None:
        self.record = EpisodeRecord(self.episode_id)

    @property
    def num_turns(self) -> int:
        """Turns published so far."""
        return len(self.record.actions)


@dataclass(slots=True)
class PreparedEpisode:
    """An episode whose env was made and reset ahead of it (``EpisodeRunner.prepare``): hand
    it to ``episode(prepared=...)`` to play it, or to ``discard`` to close its env unplayed."""

    episode: EpisodeState
    task: Task | None
    seed: int | None
    env: gym.Env | None = None
    reset: tuple[str, dict[str, Any]] | None = None
    """What ``env.reset`` returned."""
    error: Exception | None = None
    """What making or resetting the env raised (its env already closed)."""

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id


class SinkError(RuntimeError):
    """A subscriber of the runner's events raised: the consumer broke, not the episode. It
    propagates out of the runner (after the other episodes are stopped and their sandboxes
    removed) instead of being recorded as the episode's infrastructure failure."""


class RunCancelled(RuntimeError):
    """The run was cancelled (``EpisodeRunner.cancel``: an interrupt, or another episode's sink
    error): the episode ends as an infrastructure failure."""


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def outcome(reward: float, info: dict[str, Any]) -> tuple[StopReason, Grade]:
    """The stop reason and grade of a terminal ``step``'s return (the graded reward, or an
    infrastructure failure; a wrapper that truncated the episode itself counts as the turn
    limit)."""
    if info.get("infra_failure"):
        details = dict(info.get("grade_details") or {})
        details["error"] = info.get("error") or details.get("error")
        return StopReason.ERROR, Grade(0.0, infra_failure=True, details=details)
    reason = info.get("termination_reason") or StopReason.MAX_TURNS
    return StopReason(reason), Grade(float(reward), details=dict(info.get("grade_details", {})))
