"""``PolicyAgent``: an ``environments.agents.Agent`` backed by a rollout engine, token-in/token-out.

The context of each action is the concatenation of the conversation's token ids as the runner
recorded them (``Message.token_ids``: the prompt's, each action's sampled ids, each
observation's), never text re-tokenised. Each turn is one ``GenerationRequest`` whose seed is
a function of the run's seed, the episode id and the turn (``request_seed``), so a turn's
tokens do not depend on timing or on which other episodes share the engine's batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

from environments.agents import Action, ContextExhausted, Message
from thundersync.protocol.events import SpanRecorded, now
from thundersync.training.chat import ChatFormat
from thundersync.training.engines.engine import (
    Completion,
    GenerationRequest,
    SamplingParams,
    request_seed,
)


class PolicyAgent:
    """Samples each action from ``generate`` (e.g. ``DynamicBatcher.generate``).

    ``max_context`` is the model's window: when the conversation leaves no room for another
    token the agent raises ``ContextExhausted`` and the runner ends the episode as truncated
    (``StopReason.LENGTH``); an action is cut to the room that is left.
    """

    def __init__(
        self,
        generate: Callable[[GenerationRequest], Completion],
        chat: ChatFormat,
        *,
        policy_version: Callable[[], int],
        run_seed: int,
        max_new_tokens: int,
        max_context: int,
        temperature: float = 1.0,
        record: Callable[[SpanRecorded], Any] | None = None,
    ) -> None:
        self._generate = generate
        self.chat = chat
        self._version = policy_version
        self.run_seed = run_seed
        self.max_new_tokens = max_new_tokens
        self.max_context = max_context
        self.temperature = temperature
        self._record = record

    @property
    def policy_version(self) -> int:
        return self._version()

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        return self.chat.prompt_ids(text)

    def encode_observation(self, text: str) -> tuple[int, ...]:
        return self.chat.observation_ids(text)

    def act(self, task: Any, messages: Sequence[Message], *, episode_id: str) -> Action:
        request = self.request(messages, episode_id=episode_id)
        started = now()
        return self.action(
            self._generate(request), messages, episode_id=episode_id, started=started
        )

    def request(self, messages: Sequence[Message], *, episode_id: str) -> GenerationRequest:
        """``act``'s first half: the engine request for the next action (raises
        ``ContextExhausted`` when the window is full). Drivers that batch many episodes' requests
        themselves (``thundersync.training.episodes``) call it, then ``action``."""
        context = tuple(chain.from_iterable(message.token_ids for message in messages))
        turn = _turn(messages)
        room = self.max_context - len(context)
        if room < 1:
            raise ContextExhausted(
                f"episode {episode_id} turn {turn}: the conversation has {len(context)} tokens, "
                f"the policy's context window {self.max_context}"
            )
        params = SamplingParams(
            max_new_tokens=min(self.max_new_tokens, room),
            temperature=self.temperature,
            stop_ids=self.chat.stop_ids,
        )
        return GenerationRequest(context, params, request_seed(self.run_seed, episode_id, turn))

    def action(
        self,
        completion: Completion,
        messages: Sequence[Message],
        *,
        episode_id: str,
        started: float,
        finished: float | None = None,
    ) -> Action:
        """``act``'s second half: the ``Action`` of the engine's ``completion`` of ``request``
        (sent at ``started`` and answered at ``finished``, default now, on the events' clock),
        its span recorded."""
        if self._record is not None:
            self._record(
                SpanRecorded(
                    name="generate",
                    started=started,
                    finished=finished or now(),
                    worker="agent",
                    episode_id=episode_id,
                    turn=_turn(messages),
                    metrics={"num_tokens": len(completion.token_ids)},
                )
            )
        return Action(
            text=self.chat.action_text(completion.token_ids),
            token_ids=completion.token_ids,
            logprobs=completion.logprobs,
            policy_version=completion.policy_version,
        )


def _turn(messages: Sequence[Message]) -> int:
    return sum(message.role == "assistant" for message in messages)
