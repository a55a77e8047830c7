"""Errors: one base class for everything ThunderSync raises on purpose.

Each error also keeps a builtin base (``ValueError``, ``RuntimeError``, ...), so code that
catches the builtin keeps working. The rule for events: ``InvalidEventError`` when an event's
own values are wrong (a NaN reward, an id outside the vocabulary), ``EventOrderError`` when it
contradicts what was consumed before (a second reward, teacher scores of another length),
``StaleTokenError`` when its tokens come from a policy version the learner does not accept.
All three are raised before the event changes anything, so the learner stays usable.
"""

from __future__ import annotations


class ThunderSyncError(Exception):
    """Base of every error ThunderSync raises on purpose."""


class InvalidEventError(ThunderSyncError, ValueError):
    """An event's own fields are malformed or out of range; it was rejected unapplied."""


class EventOrderError(ThunderSyncError, ValueError):
    """An event contradicts what was already consumed (a duplicate, lengths that disagree, a
    turn beyond the episode's end); it was rejected unapplied."""


class StaleTokenError(ThunderSyncError, ValueError):
    """Tokens sampled by a policy version outside the learner's accepted window (streaming:
    exactly its own version; ``max_staleness=k``: its version minus k up to its version)."""


class IncompleteBatchError(ThunderSyncError, RuntimeError):
    """``step()`` was called before every input of the batch was consumed."""


class NonFiniteGradientError(ThunderSyncError, FloatingPointError):
    """``step()`` found a non-finite gradient norm. Nothing was stepped (parameters, ``.grad``
    and optimizer state are as before), the batch was dropped, and ``policy_version`` is
    unchanged: the learner takes the next batch."""


class NonFiniteParameterError(ThunderSyncError, FloatingPointError):
    """``step()``'s optimizer step made a parameter inf or NaN (a finite gradient times a
    learning rate beyond the float range, say). The parameters are as the optimizer left
    them, so the learner refuses every later step: nothing non-finite is published, saved
    or reported, and the run continues from its last checkpoint or not at all."""


class InvariantError(ThunderSyncError, RuntimeError):
    """An internal invariant broke: a bug in ThunderSync, not in the caller's input."""
