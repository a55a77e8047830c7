"""Agents: the policy side of an episode (scripted, oracle and nop agents ship here).

An agent is stateless between calls: ``act(task, messages, episode_id=...)`` sees the whole
conversation so far (the instruction first, then alternating assistant actions and user
observations, each with the token ids the policy saw for it) and returns the next ``Action``.
``encode_prompt`` and ``encode_observation`` turn the instruction and each observation into
token ids exactly as the policy will see them appended to the conversation (a chat template
wraps the first as the opening user turn and each later one as a user turn after an action);
the runner puts those ids in the events and in the next ``messages``, so a policy never
re-tokenises text. Agents without a tokenizer return ``()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from environments.actions import SUBMIT_WORD, format_action
from environments.tasks import Task

SUBMIT_ACTION = format_action(SUBMIT_WORD)


class ContextExhausted(Exception):
    """Raised by ``act`` when the conversation leaves the policy no room for another action
    (its context window is full). Control flow, not a failure: the runner ends the episode
    as truncated (``StopReason.LENGTH``) and grades it."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the conversation: ``role`` is ``"user"`` or ``"assistant"``."""

    role: str
    content: str
    token_ids: tuple[int, ...] = ()
    """The ids the policy saw for this message: ``encode_prompt``/``encode_observation``'s
    for user messages, the sampled ids for actions (empty for agents without a tokenizer)."""


@dataclass(frozen=True, slots=True)
class Action:
    """What the policy produced for one turn.

    ``token_ids``/``logprobs`` are the sampled ids and their sampling log-probs (empty when the
    agent has no tokenizer); ``policy_version`` is None to use the agent's own.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    policy_version: int | None = None


class Agent(Protocol):
    """A policy driven by ``EpisodeRunner``. Implementations don't inherit this."""

    @property
    def policy_version(self) -> int:
        """The weights version that samples this agent's actions (0 for fixed agents)."""
        ...

    def act(self, task: Task, messages: Sequence[Message], *, episode_id: str) -> Action:
        """The next action given the conversation so far (instruction first). ``episode_id``
        identifies the episode (a policy seeds its sampling from it and the turn)."""
        ...

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        """Token ids of the instruction as the opening of the conversation."""
        ...

    def encode_observation(self, text: str) -> tuple[int, ...]:
        """Token ids of an observation appended after an action."""
        ...


def _num_actions(messages: Sequence[Message]) -> int:
    return sum(1 for message in messages if message.role == "assistant")


class ScriptedAgent:
    """Plays ``actions`` (full action texts) in order, then submits: a deterministic fake.

    ``tokenize`` (optional) gives fake token ids for actions, prompts and observations;
    log-probs are 0.0 per token.
    """

    def __init__(
        self,
        actions: Sequence[str],
        *,
        tokenize: Callable[[str], tuple[int, ...]] | None = None,
        policy_version: int = 0,
    ) -> None:
        self.actions = tuple(actions)
        self.policy_version = policy_version
        self._tokenize = tokenize

    def act(self, task: Task, messages: Sequence[Message], *, episode_id: str = "") -> Action:
        index = _num_actions(messages)
        text = self.actions[index] if index < len(self.actions) else SUBMIT_ACTION
        ids = self.encode_observation(text)
        return Action(text=text, token_ids=ids, logprobs=(0.0,) * len(ids))

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        return self.encode_observation(text)

    def encode_observation(self, text: str) -> tuple[int, ...]:
        return self._tokenize(text) if self._tokenize is not None else ()


class _TextAgent:
    """An agent without a tokenizer: its episodes cannot feed a learner."""

    policy_version = 0

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        return ()

    def encode_observation(self, text: str) -> tuple[int, ...]:
        return ()


class OracleAgent(_TextAgent):
    """Runs the task's ``reference_solution()`` commands one per turn, then submits. A task
    of several steps (``reference_steps()``, one list of commands per step) gets each step's
    commands in turn: the step is the number of submissions so far (each ends a step)."""

    def act(self, task: Task, messages: Sequence[Message], *, episode_id: str = "") -> Action:
        actions = [m.content for m in messages if m.role == "assistant"]
        steps = getattr(task, "reference_steps", None)
        if callable(steps) and SUBMIT_ACTION in actions:
            done = len(actions) - 1 - actions[::-1].index(SUBMIT_ACTION)
            plan: list[list[str]] = steps()
            step = actions.count(SUBMIT_ACTION)
            commands = plan[step] if step < len(plan) else []
            index = len(actions) - done - 1
        else:
            commands = task.reference_solution()
            index = _num_actions(messages)
        if index < len(commands):
            return Action(text=format_action(commands[index]))
        return Action(text=SUBMIT_ACTION)


class NopAgent(_TextAgent):
    """Submits immediately: validates that an untouched task scores 0."""

    def act(self, task: Task, messages: Sequence[Message], *, episode_id: str = "") -> Action:
        return Action(text=SUBMIT_ACTION)


def make_agent(name: str) -> Agent:
    """The shipped agent called ``name`` (``oracle`` or ``nop``)."""
    agents: dict[str, Callable[[], Agent]] = {"oracle": OracleAgent, "nop": NopAgent}
    if name not in agents:
        raise ValueError(f"unknown agent {name!r}; expected one of {sorted(agents)}")
    return agents[name]()
