"""Data model: token-in/token-out trajectories exactly as the policy saw them.

See docs/design.md §2.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class StopReason(enum.StrEnum):
    """Why an episode ended (``EpisodeCompleted.stop_reason``)."""

    SUBMITTED = "submitted"
    """The agent submitted (the env's ``terminated``)."""
    MAX_TURNS = "max_turns"
    """The turn limit was reached (``truncated``)."""
    TIME_LIMIT = "time_limit"
    """The episode's wall-clock limit was reached (``truncated``)."""
    FORMAT_ERRORS = "format_errors"
    """Too many unparseable actions (``truncated``)."""
    LENGTH = "length"
    """The context or generation length limit was reached."""
    ERROR = "error"
    """The environment or sandbox failed (an infrastructure failure)."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One action and the observation its tool call returned.

    ``observation_ids`` is empty for the last action when it ended the episode without a tool
    call. ``teacher_logprobs`` is filled for on-policy distillation.
    """

    action_ids: tuple[int, ...]
    action_logprobs: tuple[float, ...]
    policy_version: int
    observation_ids: tuple[int, ...] = ()
    teacher_logprobs: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A whole episode: prompt, then per turn the action and its observation.

    The context the policy saw before action k is
    ``prompt_ids + a_0 + o_0 + ... + a_{k-1} + o_{k-1}``; the last observation is never
    part of any context.
    """

    episode_id: str
    group_id: str
    group_size: int
    task_id: str
    prompt_ids: tuple[int, ...]
    turns: tuple[Turn, ...]
    reward: float | None = None
    infra_failure: bool = False
    stop_reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(turn.action_ids) for turn in self.turns)

    def context_length(self) -> int:
        """``len(self.context_ids()[0])``, without building the lists."""
        tail = self.turns[:-1]
        return (
            len(self.prompt_ids)
            + sum(len(turn.action_ids) for turn in self.turns)
            + sum(len(turn.observation_ids) for turn in tail)
        )

    def context_ids(self, upto_turn: int | None = None) -> tuple[list[int], list[int]]:
        """Token ids up to and including action ``upto_turn`` (all turns when None), and for
        each position the turn index of the action token there, or -1 for prompt/observation.
        """
        last = len(self.turns) - 1 if upto_turn is None else upto_turn
        ids = list(self.prompt_ids)
        turn_of = [-1] * len(ids)
        for k, turn in enumerate(self.turns[: last + 1]):
            ids.extend(turn.action_ids)
            turn_of.extend([k] * len(turn.action_ids))
            if k < last:
                ids.extend(turn.observation_ids)
                turn_of.extend([-1] * len(turn.observation_ids))
        return ids, turn_of
