"""Deposits held back while their group is about to close: the ski-rental rule.

Streaming GRPO computes a rewarded trajectory of a group that is still open as a *deposit*:
its piece goes into the group's sums, two or three backward passes (``batch.piece_sums``),
where the same trajectory costs one once its group has closed and its advantage is known (a
*final*). When every member of the group has completed and only rewards are missing, they are
being graded and the group may close at any moment: waiting is then cheaper than depositing,
if the wait is short. How long it will be is unknown, so a group's deposits are held, from
the first, at most as long as they would take as finals at the learner's measured pace (each
reward that joins the hold lengthens it by its own trajectory's time), then made anyway: the
ski-rental rule. Whatever the grading times, waiting never costs more than about what the
deposit it avoids would have (docs/design.md §3).

The same caller lets a drain do one thing and come back for the rest: finals first (each
group's cheapest work); where a drain had finals, the deposits wait for the next drain, and
otherwise one open group's deposit runs (``next_deposit``), with the events that came in
meanwhile read in between. A group that closed during a pass then takes its waiting
trajectories as finals instead of deposits: on the matrix's balanced row the learner had
deposited four groups in a row while their last members came in, and spent half again
sync's learner time on each step (docs/measurements.md, 2026-12-06).

The hold needs its caller to come back when it expires (``Learner.wake_after``): the
training run's streaming loop does. A learner whose caller does not (the library's eager
default, data-parallel ranks) holds nothing and does everything in one drain. Held or not,
the update is the same sum.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from thundersync.core.assembly import natural_key

PACE_WEIGHT = 0.25
"""The weight of each new pass in the running estimate of the learner's pace."""


@dataclass(slots=True)
class Pace:
    """The learner's seconds per context token of a final's pass, measured on its own passes
    and kept across batches (None until the first is measured: nothing is held before)."""

    seconds_per_token: float | None = None

    def note(self, seconds: float, tokens: int) -> None:
        """One pass of finals: ``seconds`` for ``tokens`` context tokens."""
        if tokens <= 0 or seconds <= 0.0:
            return
        pace = seconds / tokens
        last = self.seconds_per_token
        self.seconds_per_token = pace if last is None else last + PACE_WEIGHT * (pace - last)

    def hold(self, held: tuple[float, float] | None, tokens: int) -> tuple[float, float] | None:
        """A hold of deposits of ``tokens`` context tokens, ``held`` so far (None: new): (since,
        until) in ``time.monotonic()``, or None once it may no longer wait."""
        now = time.monotonic()
        since = now if held is None else held[0]
        until = since + self.hold_s(tokens)
        return None if now >= until else (since, until)

    def hold_s(self, tokens: int) -> float:
        """How long a deposit of ``tokens`` context tokens may wait for its group to close:
        what computing them as finals takes (0.0 before any pass was measured)."""
        return 0.0 if self.seconds_per_token is None else self.seconds_per_token * tokens


def next_deposit(unrewarded: Mapping[str, int]) -> str:
    """Of the open groups with a deposit ready (``unrewarded``: how many of each one's members
    have no reward yet), the one to deposit now: the furthest from closing, whose trajectories
    are the least likely to become finals soon; ties by the groups' natural order."""
    return max(sorted(unrewarded, key=natural_key), key=lambda gid: unrewarded[gid])
