"""Validation of an event's own values: what is malformed is rejected before it changes state.

The rules (each violation raises ``InvalidEventError`` naming the episode, the field and the
value):

- ids (``episode_id``, ``group_id``) are strings; ``turn``, ``num_turns``, ``group_size`` and
  ``policy_version`` are ints (not bools, not floats); ``group_size >= 1``, ``turn >= 0``;
- token ids (``prompt_ids``, ``action_ids``, ``observation_ids``) are tuples (or lists) of
  ints in ``0 .. vocab_size - 1``, the rows of the model's embedding;
- log-probs (``action_logprobs``, ``teacher_logprobs``) are finite real numbers in
  ``[MIN_LOGPROB, LOGPROB_TOLERANCE]`` (engines round; a log-prob of 1e-7 is a probability
  of 1; below ``MIN_LOGPROB`` ≈ −745.13 no double-precision softmax gives a probability > 0);
- a reward is a real number (int, float, ``Fraction``, ``Decimal``, numpy scalars; not a
  bool) whose float is finite with ``|reward| <= MAX_ABS_REWARD``, infra failures too: an
  int, ``Fraction`` or ``Decimal`` beyond the float range is refused, never an
  ``OverflowError``;
- ``ToolFinished.duration_s`` is a finite real number ``>= 0``.

Checks against what was consumed before (duplicates, lengths that must agree, the context
length) are the assembler's; they raise ``EventOrderError`` or, for a context longer than the
model takes, ``InvalidEventError``.
"""

from __future__ import annotations

import decimal
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from thundersync.protocol import events as ev
from thundersync.protocol.errors import InvalidEventError, StaleTokenError

MAX_ABS_REWARD = 1e6
"""Rewards beyond ±1e6 are refused: no grader means them, and in float32 their squares (σ_g)
lose every digit of the rewards' differences."""
LOGPROB_TOLERANCE = 1e-3
"""Log-probs up to +1e-3 are accepted as engine rounding of a certain token (log 1 = 0)."""
MIN_LOGPROB = -1075 * math.log(2.0)
"""≈ −745.133 = ln 2^-1075: ``exp(x)`` of a double rounds to 0.0 for every x below it (the
smallest positive double is 2^-1074), so no softmax computed in double precision, let alone
in float32 or bfloat16, gives a token below it a probability > 0. An engine cannot have
sampled such a token, and a teacher's score below it is a sentinel for "impossible" (−1e308,
−inf stand-ins), not a probability: as a distillation target it turns the per-token
advantage into ±1e308 and the whole step's gradient into inf. Refusing it at ``consume``
names the episode and turn instead of dropping the batch at ``step``."""


@dataclass(frozen=True, slots=True)
class EventLimits:
    """What the model behind the learner can take; None means no known limit."""

    vocab_size: int | None = None
    """Token ids must be below this (the rows of the model's input embedding)."""
    max_context_tokens: int | None = None
    """An episode's context (prompt, actions, observations but the last) may not be longer."""


@dataclass(frozen=True, slots=True)
class VersionWindow:
    """The policy versions whose tokens the learner accepts: ``learner_version − max_lag``
    up to ``learner_version`` (streaming: ``max_lag = 0``, zero staleness)."""

    learner_version: int
    max_lag: int
    why: str
    """Said in the error: why the window is what it is."""

    def check(self, event: ev.Event) -> None:
        """Raise ``StaleTokenError`` for an ``EpisodeStarted``/``TurnCompleted`` outside it."""
        if not isinstance(event, ev.EpisodeStarted | ev.TurnCompleted):
            return
        low, high = self.learner_version - self.max_lag, self.learner_version
        if not low <= event.policy_version <= high:
            accepted = f"version {high}" if low == high else f"versions {low}..{high}"
            raise StaleTokenError(
                f"{describe(event)} was sampled by policy version {event.policy_version}, but "
                f"the learner is at version {self.learner_version} and accepts {accepted}: "
                f"{self.why}"
            )


def describe(event: ev.Event) -> str:
    """``TurnCompleted(episode_id='g0-e1', turn=2)``: how errors name an event."""
    parts = [f"episode_id={getattr(event, 'episode_id', None)!r}"]
    if hasattr(event, "turn"):
        parts.append(f"turn={event.turn!r}")
    return f"{type(event).__name__}({', '.join(parts)})"


def check_event(event: object, limits: EventLimits) -> None:
    """Raise ``InvalidEventError`` if ``event``'s own values break a rule of the module doc."""
    if not isinstance(event, ev.Event):
        raise InvalidEventError(
            f"expected a thundersync.events event, got {type(event).__name__}: {event!r:.200}"
        )
    if not hasattr(event, "episode_id") or isinstance(event, ev.GradientComputed):
        return
    where = describe(event)
    _string(where, "episode_id", event.episode_id)
    match event:
        case ev.EpisodeStarted():
            _string(where, "group_id", event.group_id)
            _integer(where, "group_size", event.group_size, minimum=1)
            _integer(where, "policy_version", event.policy_version)
            _token_ids(where, "prompt_ids", event.prompt_ids, limits.vocab_size)
            if not event.prompt_ids:
                raise InvalidEventError(
                    f"{where}: empty prompt_ids; a policy's first token needs context (an "
                    "agent without a tokenizer cannot feed a learner)"
                )
        case ev.TurnCompleted():
            _integer(where, "turn", event.turn, minimum=0)
            _integer(where, "policy_version", event.policy_version)
            _token_ids(where, "action_ids", event.action_ids, limits.vocab_size)
            _logprobs(where, "action_logprobs", event.action_logprobs)
            if len(event.action_ids) != len(event.action_logprobs):
                raise InvalidEventError(
                    f"{where}: {len(event.action_ids)} action_ids but "
                    f"{len(event.action_logprobs)} action_logprobs (expected one per token)"
                )
            if not event.action_ids:
                raise InvalidEventError(f"{where}: no action tokens (action_ids is empty)")
        case ev.ToolFinished():
            _integer(where, "turn", event.turn, minimum=0)
            _token_ids(where, "observation_ids", event.observation_ids, limits.vocab_size)
            _real(where, "duration_s", event.duration_s, low=0.0, high=math.inf)
        case ev.EpisodeCompleted():
            _integer(where, "num_turns", event.num_turns, minimum=0)
        case ev.RewardReady():
            _real(where, "reward", event.reward, low=-MAX_ABS_REWARD, high=MAX_ABS_REWARD)
            if not isinstance(event.infra_failure, bool):
                raise InvalidEventError(
                    f"{where}: infra_failure={event.infra_failure!r}: expected a bool"
                )
        case ev.TeacherScored():
            _integer(where, "turn", event.turn, minimum=0)
            _logprobs(where, "teacher_logprobs", event.teacher_logprobs)


def _string(where: str, name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise InvalidEventError(f"{where}: {name}={value!r}: expected a str")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _integer(where: str, name: str, value: Any, *, minimum: int | None = None) -> None:
    if not _is_int(value):
        raise InvalidEventError(f"{where}: {name}={value!r}: expected an int")
    if minimum is not None and value < minimum:
        raise InvalidEventError(f"{where}: {name}={value!r}: expected an int >= {minimum}")


def as_finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a real number (bools are not) or
    its float is not finite: ints, ``Fraction`` and ``Decimal`` beyond ±1.8e308 included
    (``float(10**400)`` raises ``OverflowError``, ``math.isfinite(10**400)`` too)."""
    if type(value) is float:  # the fast path
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, numbers.Real | decimal.Decimal):
        return None
    try:
        result = float(value)
    except (OverflowError, ValueError, decimal.InvalidOperation):  # sNaN raises ValueError
        return None
    return result if math.isfinite(result) else None


def _real(where: str, name: str, value: Any, *, low: float, high: float) -> None:
    number = as_finite_float(value)
    if number is None or not low <= number <= high:
        bounds = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
        raise InvalidEventError(
            f"{where}: {name}={value!r:.80}: expected a finite real number {bounds} (not a "
            "bool; an int, Fraction or Decimal must fit a float)"
        )


def _sequence(where: str, name: str, value: Any) -> None:
    if not isinstance(value, tuple | list):
        raise InvalidEventError(
            f"{where}: {name} is a {type(value).__name__}: expected a tuple of numbers"
        )


def _token_ids(where: str, name: str, ids: Sequence[Any], vocab_size: int | None) -> None:
    _sequence(where, name, ids)
    if not all(type(x) is int for x in ids):  # the fast path; numpy ints are fine too
        for i, x in enumerate(ids):
            if not _is_int(x):
                raise InvalidEventError(
                    f"{where}: {name}[{i}]={x!r} ({type(x).__name__}): expected an int token id"
                )
    if not ids:
        return
    low, high = min(ids), max(ids)
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bad = low if low < 0 else high
        raise InvalidEventError(
            f"{where}: {name}[{list(ids).index(bad)}]={bad}: outside the model's vocabulary "
            f"0..{'' if vocab_size is None else vocab_size - 1} (its embedding rows)"
        )


def _logprobs(where: str, name: str, values: Sequence[Any]) -> None:
    _sequence(where, name, values)
    for i, x in enumerate(values):
        number = as_finite_float(x)
        if number is None or not MIN_LOGPROB <= number <= LOGPROB_TOLERANCE:
            raise InvalidEventError(
                f"{where}: {name}[{i}]={x!r:.80}: expected a finite log-prob in "
                f"[{MIN_LOGPROB:.2f}, {LOGPROB_TOLERANCE:g}] (a real number, at most rounding "
                "above 0, and no lower than ln 2^-1075, below which a double softmax gives 0)"
            )
