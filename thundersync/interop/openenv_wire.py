"""What a served ThunderSync env says over OpenEnv: its action, observation and state models.

Declared once, here, for both ends: ``openenv_server`` answers with these models and
``openenv_env`` (the client Gymnasium env) validates what a server answers against them, so a
server that answers something else is an infrastructure failure naming the field, not a
``KeyError`` three calls later. An OpenEnv observation carries its own ``reward`` and ``done``;
the fields below are ``ShellEnv``'s ``info`` that a trainer needs (OpenEnv's serializer drops an
observation's ``metadata``, so nothing may travel there).
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State

ACTION_FIELD = "text"
"""The action's one field: the agent's whole reply (a fenced ```bash block, as in
``environments.actions``)."""


class TextAction(Action):
    """One agent reply, as ``ShellEnv.step`` takes it."""

    text: str


class TextObservation(Observation):
    """What ``reset`` (the task's instruction) or ``step`` (the tool's output) returned.

    ``reward`` is None until the terminal step, which carries the grade ThunderSync computed
    on the server's side; ``done`` is True on that step (``truncated`` says whether a limit or
    a failure ended it rather than a submission)."""

    text: str
    task_id: str = ""
    turn: int | None = None
    truncated: bool = False
    termination_reason: str | None = None
    infra_failure: bool = False
    error: str | None = None
    format_error: str | None = None
    tool: dict[str, Any] | None = None
    grade_details: dict[str, Any] | None = None
    strict_grading: bool = True


class EpisodeState(State):
    """``episode_id`` and ``step_count`` (OpenEnv's), and the episode's task."""

    task_id: str = ""
