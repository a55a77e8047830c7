"""Agents: the policy side of an episode (scripted, oracle and nop agents ship here).

An agent is stateless between calls: ``act(task, messages)`` sees the whole conversation so
far (the instruction first, then alternating assistant actions and user observations) and
returns the next ``Action``. ``encode`` turns the prompt and each observation into the token
ids the policy saw, so the runner can put them in events; agents without a tokenizer return
``()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from environments.actions import SUBMIT_WORD, format_action
from environments.tasks import Task

SUBMIT_ACTION = format_action(SUBMIT_WORD)


@dataclass(frozen=True, slots=True)
class Message:
    """One message of the conversation: ``role`` is ``"user"`` or ``"assistant"``."""

    role: str
    content: str


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

    policy_version: int
    """The weights version that samples this agent's actions (0 for fixed agents)."""

    def act(self, task: Task, messages: Sequence[Message]) -> Action:
        """The next action given the conversation so far (instruction first)."""
        ...

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of a prompt or observation, exactly as the policy sees them."""
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

    def act(self, task: Task, messages: Sequence[Message]) -> Action:
        index = _num_actions(messages)
        text = self.actions[index] if index < len(self.actions) else SUBMIT_ACTION
        ids = self.encode(text)
        return Action(text=text, token_ids=ids, logprobs=(0.0,) * len(ids))

    def encode(self, text: str) -> tuple[int, ...]:
        return self._tokenize(text) if self._tokenize is not None else ()


class OracleAgent:
    """Runs the task's ``reference_solution()`` commands one per turn, then submits."""

    policy_version = 0

    def act(self, task: Task, messages: Sequence[Message]) -> Action:
        commands = task.reference_solution()
        index = _num_actions(messages)
        if index < len(commands):
            return Action(text=format_action(commands[index]))
        return Action(text=SUBMIT_ACTION)

    def encode(self, text: str) -> tuple[int, ...]:
        return ()


class NopAgent:
    """Submits immediately: validates that an untouched task scores 0."""

    policy_version = 0

    def act(self, task: Task, messages: Sequence[Message]) -> Action:
        return Action(text=SUBMIT_ACTION)

    def encode(self, text: str) -> tuple[int, ...]:
        return ()


def make_agent(name: str) -> Agent:
    """The shipped agent called ``name`` (``oracle`` or ``nop``)."""
    agents: dict[str, Callable[[], Agent]] = {"oracle": OracleAgent, "nop": NopAgent}
    if name not in agents:
        raise ValueError(f"unknown agent {name!r}; expected one of {sorted(agents)}")
    return agents[name]()
